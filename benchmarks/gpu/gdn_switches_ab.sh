# One H200 call (about six minutes): the gated delta rule's XLA_OPERANDS switch
# (mixer_kernels/mosaic_gpu/gated_delta/vjp.py) against the default. First per-kernel traces of
# the op's forward+backward at (4, 4096, 16, 128) with the default and with "16-bit"; then
# `python -m train bench gdn_125m` at 2048 x 8 with each (tokens/s, peak memory, compile). (The
# 2026-12-02 run also timed RESIDUALS="inputs", since removed.) Needs the
# wheels of grain, array_record, portpicker and tensorboardX in .whl/. Writes
# gdn_switches_ab.txt and the traces' and benches' JSON to $OUT.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
for switch in "" "--xla-operands 16-bit"; do
  echo "=== op trace ${switch:-defaults}"
  timeout 75 python3 benchmarks/op_trace.py gdn --shape 4,4096,16,128 --top 12 $switch \
      --out $OUT 2>&1 | grep -E "wall median|  [0-9.]+ ms"
done
export PRESETS_2K=gdn_125m PRESETS_8K= LIMIT=${LIMIT:-150}
echo "=== trainer, defaults"
bash benchmarks/gpu/trainer_contexts.sh
echo "=== trainer, XLA_OPERANDS=16-bit"
XLA_OPERANDS=16-bit bash benchmarks/gpu/trainer_contexts.sh
} 2>&1 | tee $OUT/gdn_switches_ab.txt
