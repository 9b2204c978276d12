# One H200 call (about eight minutes: each 32000-step run of 15 seeds takes about 55 s, FPA 110 s): the ladder at r = 18 with the width and batch that the
# d = r + 2 control needs (results/README.md, "Ladder": on 2 CPU cores a 15-seed run of one
# method at width 64, batch 64 and 32000 steps takes about three hours). First a 15-seed,
# 800-step run that prints the GPU's speed; then the control (head dim 20), one method per run
# so that each finished method keeps its files: NoPE, FoX, RoPE, 15 seeds, 32000 steps; then,
# while the call has time, the d = 4 rows (FPA, NoPE, FoX, RoPE) at the same settings.
# Writes $OUT/probes_ladder_r18.txt and $OUT/ladder_r18.tar.gz, holding each run's
# ladder_bag_r18_<d>_w64_b64_<method>/probe.{json,csv,png} (a call brings back at most 8 files;
# unpack them into results/probes_gpu/).
export PYTHONUNBUFFERED=1
P="python3 -m train probe ladder seeds=15 train_size=16384 rungs=18 model_dim=64 batch_size=64"
{
echo "=== speed: 800 steps"
timeout 120 $P head_dim=20 methods=softmax_nope steps=800 eval_every=400 \
    out=/tmp/ladder/ladder_bag_r18_speed | tail -4
for run in ${RUNS:-d20:softmax_nope d20:fox d20:softmax_rope d4:fpa d4:softmax_nope d4:fox d4:softmax_rope}; do
  d=${run%%:*}; method=${run#*:}
  echo "=== $d, $method"
  timeout ${LIMIT:-150} $P head_dim=${d#d} methods=$method steps=32000 eval_every=1600 \
      out=/tmp/ladder/ladder_bag_r18_${d}_w64_b64_$method | tail -3
done
} 2>&1 | tee $OUT/probes_ladder_r18.txt
tar -czf $OUT/ladder_r18.tar.gz -C /tmp/ladder .
