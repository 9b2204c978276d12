# On an H200 (375-450 s for the seven default runs at r = 10 and r = 14): ladder rows at width 64
# and batch 64, the settings the d = r + 2 control needs at r = 18 (results/README.md, "Ladder":
# on 2 CPU cores a 15-seed run of one method at width 64, batch 64 and 32000 steps takes about
# three hours; on the H200 about 55 s, FPA 110 s). RUNGS (default 18) picks r; RUNS the runs,
# each "d<head dim>:<method>" (default: the control at
# d = 20, NoPE, FoX, RoPE, then the d = 4 rows, FPA, NoPE, FoX, RoPE), one method per run so that
# each finished run keeps its files; LIMIT seconds per run; SPEED=1 first times a 15-seed,
# 800-step run. Every run: 15 seeds, 32000 steps, train_size 16384.
#   RUNGS=10 RUNS="d12:softmax_nope d12:fox d4:fpa d4:fox" LIMIT=140 bash benchmarks/gpu/probes_ladder_w64.sh
# Writes $OUT/probes_ladder_r<r>.txt and $OUT/ladder_r<r>.tar.gz, holding each run's
# ladder_bag_r<r>_<d>_w64_b64_<method>/probe.{json,csv,png} (packed into one archive; unpack it
# into results/probes_gpu/).
export PYTHONUNBUFFERED=1
r=${RUNGS:-18}
P="python3 -m train probe ladder seeds=15 train_size=16384 rungs=$r model_dim=64 batch_size=64"
{
if [ "${SPEED:-0}" = 1 ]; then
  echo "=== speed: 800 steps"
  timeout 120 $P head_dim=$((r + 2)) methods=softmax_nope steps=800 eval_every=400 \
      out=/tmp/speed/ladder_bag_r${r}_speed | tail -4
fi
for run in ${RUNS:-d$((r + 2)):softmax_nope d$((r + 2)):fox d$((r + 2)):softmax_rope d4:fpa d4:softmax_nope d4:fox d4:softmax_rope}; do
  d=${run%%:*}; method=${run#*:}
  echo "=== r = $r, $d, $method"
  timeout ${LIMIT:-150} $P head_dim=${d#d} methods=$method steps=32000 eval_every=1600 \
      out=/tmp/ladder/ladder_bag_r${r}_${d}_w64_b64_$method | tail -3
done
} 2>&1 | tee $OUT/probes_ladder_r$r.txt
tar -czf $OUT/ladder_r$r.tar.gz -C /tmp/ladder .
