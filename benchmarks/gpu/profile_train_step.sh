# One H200 call: where one 125M train step's device time goes. `python -m train bench` of each
# preset in PRESETS (context CONTEXT, batch BATCH) with a 3-step jax.profiler trace, then the
# trace's TOP costliest kernels and XLA ops in ms per step (train/profile_trace.py). Needs the
# wheels of grain, array_record, portpicker and tensorboardX in .whl/; writes
# profile_<preset>.txt, bench_<preset>.json and the traces (traces.tgz) to $OUT.
# NAMES=1: command buffers off and the optimized HLO dumped, so that each kernel is named by
# its JAX op and source line (benchmarks/fusion_sources.py; sources_<preset>.txt).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for preset in ${PRESETS:-gdn_125m}; do
  if [ -n "$NAMES" ]; then
    export XLA_FLAGS="$XLA_FLAGS --xla_gpu_enable_command_buffer= --xla_dump_to=/tmp/hlo/$preset --xla_dump_hlo_as_text"
  fi
  timeout ${LIMIT:-200} python3 -m train bench $preset --context ${CONTEXT:-2048} \
      --batch-size ${BATCH:-8} --steps 4 --profile /tmp/traces/$preset \
      --out $OUT/bench_$preset${NAMES:+_no_command_buffers}.json 2>&1 | grep -E "ms / step|tokens/s|compile|error"
  python3 - $preset ${TOP:-30} <<'PY' | tee $OUT/profile_$preset.txt
import sys
from train.profile_trace import event_totals
preset, top = sys.argv[1], int(sys.argv[2])
totals = event_totals(f"/tmp/traces/{preset}")
whole = sum(totals.values())
print(f"{preset}: {whole / 3e3:.1f} ms of device time per step (3 profiled steps)")
for name, micros in totals.most_common(top):
    print(f"{micros / 3e3:8.3f} ms  {100 * micros / whole:5.1f}%  {name[:110]}")
PY
  if [ -n "$NAMES" ]; then
    python3 benchmarks/fusion_sources.py /tmp/traces/$preset /tmp/hlo/$preset --top ${TOP:-30} \
        > $OUT/sources_$preset.txt 2>&1; head -60 $OUT/sources_$preset.txt
  fi
done
tar czf $OUT/traces.tgz -C /tmp traces
