# On an H100 or H200 (about four minutes): the short convolution's backward with dx formed in
# its kernel (mixer_kernels/mosaic_gpu/short_conv/backward.py DX_IN_KERNEL) against d total
# plus XLA's dx pass, one run. Per setting, the compiled accuracy and time against "xla" with
# the device ms per kernel (benchmarks/short_conv_gpu.py --trace, which exits 1 past its
# accuracy bar), then the gdn_125m step at 2048 x 8. Needs the wheels of grain, array_record,
# portpicker and tensorboardX in .whl/ for the train step; writes to $OUT.
#     bash benchmarks/gpu/short_conv_dx_ab.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{
for setting in off on; do
  echo "=== dx in kernel $setting: accuracy, ms, device ms"
  CONV_DX=$setting timeout 90 python3 benchmarks/gpu/with_knobs.py benchmarks/short_conv_gpu.py \
      --trace 2>&1 | grep -E "^\| |device|short_conv_|fusion|convert|rror"
  echo "short_conv_gpu rc=${PIPESTATUS[0]} (1: past its accuracy bar)"
done
bash benchmarks/gpu/bench_knob_ab.sh CONV_DX gdn_125m off on
} | tee $OUT/short_conv_dx_ab.txt
