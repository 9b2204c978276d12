# On an H100 or H200 (about six minutes): KERNEL_BARRIERS (mixer_kernels/mosaic_gpu/common.py)
# "explicit" against "automatic" in one run. First the compiled kernels' accuracy in both
# settings (the gated delta rule's bf16 output and gradients against a float32 recurrence at
# two shapes; the short convolution against float32, which exits 1 past its bar), then device
# ms per kernel (op_trace of the gated delta rule's output and gradient; short_conv_gpu's
# trace), then the gdn_125m train step at 2048 x 8 in both settings. Needs the wheels of grain,
# array_record, portpicker and tensorboardX in .whl/ for the train step; writes to $OUT.
#     bash benchmarks/gpu/kernel_barriers_ab.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
knobs="python3 benchmarks/gpu/with_knobs.py"   # BARRIERS=mode $knobs SCRIPT|-m MODULE ARGS
{
for mode in automatic explicit; do
  echo "=== $mode: accuracy"
  for shape in 4,2048,12,64 2,4096,16,128; do
    BARRIERS=$mode timeout 70 $knobs -m benchmarks.gated_delta_gpu_accuracy jax /tmp/a.npz $shape 2>&1 \
        | grep -E "vs f32|rror"
  done
  BARRIERS=$mode timeout 60 $knobs benchmarks/short_conv_gpu.py 2>&1 | grep -E "^\| |rror"
  echo "short_conv_gpu rc=${PIPESTATUS[0]} (1: past its accuracy bar)"
done
for mode in automatic explicit; do
  echo "=== $mode: device ms"
  BARRIERS=$mode timeout 120 $knobs benchmarks/op_trace.py gdn --shape 8,2048,12,64 4,4096,16,128 \
      --with-output --top 10 --out /tmp 2>&1 | grep -v Warning | tail -28
  BARRIERS=$mode timeout 60 $knobs benchmarks/short_conv_gpu.py --trace 2>&1 | grep -E "device|short_conv_"
done
bash benchmarks/gpu/bench_knob_ab.sh BARRIERS gdn_125m automatic explicit
} | tee $OUT/kernel_barriers_ab.txt
