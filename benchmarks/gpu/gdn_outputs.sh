# On an H200 (about six minutes): the gated delta rule's chunk output kernels
# (mixer_kernels/mosaic_gpu/gated_delta/output_kernels.py, switch vjp.OUTPUTS). The op's bf16
# output and gradients against a float32 recurrence, ours and fla's, at D = 64 and 128
# (benchmarks/gated_delta_gpu_accuracy.py); per-kernel traces of the op's forward+backward with
# OUTPUTS=pallas and OUTPUTS=xla (benchmarks/op_trace.py, ptxas register and spill lines kept);
# then benchmarks/bench_gdn.py --gpu, ours against fla's Triton kernel at its three shapes.
# Knobs: SHAPES (the traces'). Needs the wheels of flash-linear-attention in .whl/; writes
# gdn_outputs.txt, the traces' JSON and gdn_gpu.json to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{
for shape in 4,2048,12,64 2,4096,16,128; do
  echo "=== accuracy at $shape"
  timeout 60 python3 -m benchmarks.gated_delta_gpu_accuracy jax /tmp/gdn_accuracy.npz $shape
  timeout 60 python3 -m benchmarks.gated_delta_gpu_accuracy torch /tmp/gdn_accuracy.npz
done 2>&1 | grep -E "===|vs f32|Error|error"
for outputs in pallas xla; do
  echo "=== op trace, OUTPUTS=$outputs"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 100 python3 benchmarks/op_trace.py gdn \
      --shape ${SHAPES:-8,2048,12,64 4,4096,16,128} --top 14 --outputs $outputs --out $OUT 2>&1 \
      | grep -E "wall median|  [0-9.]+ ms|entry function|Used [0-9]+ reg|spill stores,|Error|error"
done
echo "=== bench_gdn"
timeout 240 python3 benchmarks/bench_gdn.py --gpu --implementations pallas --json $OUT/gdn_gpu.json 2>&1 \
    | grep -vE "Warning|^\s*$"
} 2>&1 | tee $OUT/gdn_outputs.txt
