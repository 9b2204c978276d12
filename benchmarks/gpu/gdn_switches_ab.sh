# On an H200 (about seven minutes): one switch of the gated delta rule
# (mixer_kernels/mosaic_gpu/gated_delta/vjp.py) against the defaults. SWITCH names it as
# NAME=value: RESIDUALS=internals (the default here), XLA_OPERANDS=16-bit, OUTPUTS=xla or STATE_GRADIENTS=xla. First per-kernel
# traces of the op's forward+backward at (4, 4096, 16, 128) with the defaults and with the
# switch; then `python -m train bench gdn_125m` at 2048 x 8 with each (tokens/s, peak memory,
# compile). Needs the wheels of grain, array_record, portpicker and tensorboardX in .whl/.
# Writes gdn_switches_ab.txt and the traces' and benches' JSON to $OUT.
#   SWITCH=RESIDUALS=internals bash benchmarks/gpu/gdn_switches_ab.sh      # wheels in .whl/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
switch=${SWITCH:-RESIDUALS=internals}
name=${switch%%=*}; value=${switch#*=}
case $name in RESIDUALS|XLA_OPERANDS|OUTPUTS|STATE_GRADIENTS) ;; *) echo "error: SWITCH: expected RESIDUALS=..., XLA_OPERANDS=..., OUTPUTS=... or STATE_GRADIENTS=..., got $switch"; exit 2;; esac
flag="--$(echo $name | tr 'A-Z_' 'a-z-') $value"     # op_trace.py's option
{
for option in "" "$flag"; do
  echo "=== op trace ${option:-defaults}"
  timeout 75 python3 benchmarks/op_trace.py gdn --shape 4,4096,16,128 --top 12 $option \
      --out $OUT 2>&1 | grep -E "wall median|  [0-9.]+ ms"
done
export PRESETS_2K=gdn_125m PRESETS_8K= LIMIT=${LIMIT:-250}
echo "=== trainer, defaults"
bash benchmarks/gpu/trainer_contexts.sh
echo "=== trainer, $switch"
env $switch bash benchmarks/gpu/trainer_contexts.sh
} 2>&1 | tee $OUT/gdn_switches_ab.txt
