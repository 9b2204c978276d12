# On an H200 (about eight minutes): `python -m train bench` of the 125M presets at context
# 2048 (batch 8) and at context 8192 (batch 2: the same tokens per step). Needs the wheels of
# grain, array_record, portpicker and tensorboardX in .whl/; writes bench_<preset>_<context>.json
# and trainer_contexts.txt to $OUT. Knobs: PRESETS_2K, PRESETS_8K, STEPS, LIMIT (seconds per
# run), the GDN kernels' switches INTRA, CONV, XLA_OPERANDS, RESIDUALS, OUTPUTS and
# STATE_GRADIENTS and the attention kernels' FIELDS (benchmarks/gpu/with_knobs.py; unset: the library's defaults).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
bench() {  # preset context batch
  timeout ${LIMIT:-200} python3 benchmarks/gpu/with_knobs.py -m train bench $1 --context $2 \
      --batch-size $3 --steps ${STEPS:-8} --out $OUT/bench_$1_$2${CONV:+_conv_$CONV}${XLA_OPERANDS:+_xla_$XLA_OPERANDS}${RESIDUALS:+_residuals_$RESIDUALS}${OUTPUTS:+_outputs_$OUTPUTS}${STATE_GRADIENTS:+_state_gradients_$STATE_GRADIENTS}${FIELDS:+_fields_$FIELDS}.json
}
run() {
  start=$(date +%s)
  bench "$@" 2>&1 | grep -E "config|context|ms / step|tokens/s|MFU|compile|peak|estimate|error" \
      || echo "$1 at $2: no result"
  echo "  ($1 at $2: $(( $(date +%s) - start )) s in all)"
}
{
for preset in ${PRESETS_2K-fpa_125m fox_125m softmax_rope_125m gdn_125m hybrid_125m}; do
  run $preset 2048 8
done
for preset in ${PRESETS_8K-gdn_125m softmax_rope_125m hybrid_125m}; do
  run $preset 8192 2
done
} | tee $OUT/trainer_contexts.txt
