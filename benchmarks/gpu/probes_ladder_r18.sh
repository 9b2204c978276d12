# One H200 call (at most ten minutes): the ladder at r = 18 with the width and batch that the
# d = r + 2 control needs (results/README.md, "Ladder": on 2 CPU cores a 15-seed run of one
# method at width 64, batch 64 and 32000 steps takes about three hours). First a 15-seed,
# 800-step run that prints the GPU's speed; then the control (head dim 20: NoPE, FoX, RoPE)
# and the d = 4 rows (FPA, NoPE, FoX, RoPE), 15 seeds, 32000 steps, the same settings.
# Writes $OUT/ladder_bag_r18_*/probe.{json,csv,png} (copy them to results/probes_gpu/).
export PYTHONUNBUFFERED=1
P="python3 -m train probe ladder seeds=15 train_size=16384 rungs=18 model_dim=64 batch_size=64"
{
echo "=== speed: 800 steps"
timeout 120 $P head_dim=20 methods=softmax_nope steps=800 eval_every=400 \
    out=$OUT/ladder_bag_r18_speed | tail -4
echo "=== control, d = 20"
timeout ${LIMIT:-240} $P head_dim=20 methods=softmax_nope,fox,softmax_rope steps=32000 \
    eval_every=1600 out=$OUT/ladder_bag_r18_d20_w64_b64 | tail -8
echo "=== d = 4"
timeout ${LIMIT:-240} $P head_dim=4 methods=fpa,softmax_nope,fox,softmax_rope steps=32000 \
    eval_every=1600 out=$OUT/ladder_bag_r18_d4_w64_b64 | tail -9
} 2>&1 | tee $OUT/probes_ladder_r18.txt
