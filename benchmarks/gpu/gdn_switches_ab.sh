# One H200 call (about nine minutes): the gated delta rule's two memory/speed switches
# (mixer_kernels/mosaic_gpu/gated_delta/vjp.py) against the defaults. First per-kernel traces of
# the op's forward+backward at (4, 4096, 16, 128) and (8, 2048, 12, 64) with the defaults,
# XLA_OPERANDS="16-bit" and RESIDUALS="inputs"; then `python -m train bench gdn_125m` at 2048 x 8
# with the defaults, with "16-bit", and with "16-bit" and "inputs" (tokens/s, peak memory,
# compile). Needs the wheels of grain, array_record, portpicker and tensorboardX in .whl/.
# Writes gdn_switches_ab.txt and the traces' and benches' JSON to $OUT.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
for switch in "" "--xla-operands 16-bit" "--residuals inputs"; do
  echo "=== op trace ${switch:-defaults}"
  timeout 80 python3 benchmarks/op_trace.py gdn --shape 4,4096,16,128 8,2048,12,64 --top 12 \
      $switch --out $OUT 2>&1 | grep -E "wall median|  [0-9.]+ ms"
done
export PRESETS_2K=gdn_125m PRESETS_8K= LIMIT=${LIMIT:-150}
echo "=== trainer, defaults"
bash benchmarks/gpu/trainer_contexts.sh
echo "=== trainer, XLA_OPERANDS=16-bit"
XLA_OPERANDS=16-bit bash benchmarks/gpu/trainer_contexts.sh
echo "=== trainer, XLA_OPERANDS=16-bit RESIDUALS=inputs"
XLA_OPERANDS=16-bit RESIDUALS=inputs bash benchmarks/gpu/trainer_contexts.sh
} 2>&1 | tee $OUT/gdn_switches_ab.txt
