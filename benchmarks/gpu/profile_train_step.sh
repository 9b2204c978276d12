# On an H200: where one 125M train step's device time goes. `python -m train bench` of each
# preset in PRESETS (context CONTEXT, batch BATCH) with a 3-step jax.profiler trace, then the
# trace's TOP costliest kernels and XLA ops in ms per step (benchmarks/fusion_sources.py).
# Needs the wheels of grain, array_record, portpicker and tensorboardX in .whl/; writes
# profile_<preset>.txt, bench_<preset>.json and the traces (traces.tgz) to $OUT.
# NAMES=1: command buffers off and the optimized HLO dumped, so that each kernel is named by
# its JAX op in profile_<preset>.txt; the bench then needs more than 150 s for gdn_125m (the
# default LIMIT is 300 s with NAMES, 200 s without).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BASE_FLAGS=$XLA_FLAGS
limit=${LIMIT:-$([ -n "$NAMES" ] && echo 300 || echo 200)}
for preset in ${PRESETS:-gdn_125m}; do
  if [ -n "$NAMES" ]; then
    export XLA_FLAGS="$BASE_FLAGS --xla_gpu_enable_command_buffer= --xla_dump_to=/tmp/hlo/$preset --xla_dump_hlo_as_text"
  fi
  timeout $limit python3 -m train bench $preset --context ${CONTEXT:-2048} \
      --batch-size ${BATCH:-8} --steps 4 --profile /tmp/traces/$preset \
      --out $OUT/bench_$preset${NAMES:+_no_command_buffers}.json 2>&1 | grep -E "ms / step|tokens/s|compile|error"
  python3 benchmarks/fusion_sources.py /tmp/traces/$preset ${NAMES:+/tmp/hlo/$preset} \
      --top ${TOP:-30} 2>&1 | tee $OUT/profile_$preset.txt
done
tar czf $OUT/traces.tgz -C /tmp traces
