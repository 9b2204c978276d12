# On an H200 (about ten minutes): one of the gated delta rule's kernel switches
# (mixer_kernels/mosaic_gpu/gated_delta/vjp.py) in its "pallas" and "xla" settings. SWITCH names
# it: OUTPUTS (the chunk output kernels, output_kernels.py) or STATE_GRADIENTS (the state
# recurrence's dW, dKw, drho, state_gradient_kernel.py; the default). The op's bf16 output and
# gradients against a float32 recurrence, ours and fla's, at D = 64 and 128
# (benchmarks/gated_delta_gpu_accuracy.py); per-kernel traces of the op's forward+backward with
# each setting (benchmarks/op_trace.py, ptxas register and spill lines kept); then
# benchmarks/bench_gdn.py --gpu, ours against fla's Triton kernel at its three shapes.
# Knobs: SWITCH, SHAPES (the traces'), CALLS (bench_gdn's calls per timed sample, both sides;
# default 10). Needs the wheels of flash-linear-attention in .whl/;
# writes gdn_kernel_ab.txt, the traces' JSON and gdn_gpu.json to $OUT.
#   SWITCH=STATE_GRADIENTS bash benchmarks/gpu/gdn_kernel_ab.sh      # wheels in .whl/
switch=${SWITCH:-STATE_GRADIENTS}
case $switch in OUTPUTS|STATE_GRADIENTS) ;; *) echo "error: SWITCH: expected OUTPUTS or STATE_GRADIENTS, got $switch"; exit 2;; esac
flag="--$(echo $switch | tr 'A-Z_' 'a-z-')"     # op_trace.py's option
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{
for shape in 4,2048,12,64 2,4096,16,128; do
  echo "=== accuracy at $shape"
  timeout 60 python3 -m benchmarks.gated_delta_gpu_accuracy jax /tmp/gdn_accuracy.npz $shape \
      || echo "error: the jax side exited $?"
  timeout 150 python3 -m benchmarks.gated_delta_gpu_accuracy torch /tmp/gdn_accuracy.npz \
      || echo "error: the torch side exited $? (124: timed out in fla's autotuning)"
done 2>&1 | grep -E "===|vs f32|Error|error"
for setting in pallas xla; do
  echo "=== op trace, $switch=$setting"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 100 python3 benchmarks/op_trace.py gdn \
      --shape ${SHAPES:-8,2048,12,64 4,4096,16,128} --top 14 $flag $setting --out $OUT 2>&1 \
      | grep -E "wall median|  [0-9.]+ ms|entry function|Used [0-9]+ reg|spill stores,|Error|error"
done
echo "=== bench_gdn"
timeout 240 python3 benchmarks/bench_gdn.py --gpu --implementations pallas \
    --calls-per-sample ${CALLS:-10} --json $OUT/gdn_gpu.json 2>&1 \
    | grep -vE "Warning|^\s*$"
} 2>&1 | tee $OUT/gdn_kernel_ab.txt
