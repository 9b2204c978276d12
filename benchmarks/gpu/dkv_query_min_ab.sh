# On an H100 or H200 (about six minutes): FPA's dk/dv sweep with and without the query-minimum
# share path (mixer_kernels/mosaic_gpu/attention/backward.py DKV_QUERY_MIN_PATH), one run.
# First the compiled gradients with the path on against "xla" (gradient_check_gpu.py), then
# device ms per kernel at the train step's shape with FoX's and flat fields in both settings
# (op_trace.py, with ptxas's register lines), then the fpa_125m step at 2048 x 8 in both
# settings. Needs the wheels of grain, array_record, portpicker and tensorboardX in .whl/ for
# the train step; writes to $OUT.
#     bash benchmarks/gpu/dkv_query_min_ab.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{
echo "=== on: compiled gradients against xla"
timeout 150 python3 benchmarks/gradient_check_gpu.py --ops fpa --dims 64,128 --dkv-query-min on \
    2>&1 | grep -v Warning
for setting in off on; do
  echo "=== $setting: device ms"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 python3 benchmarks/op_trace.py fpa --shape 8,2048,12,64 \
      --fields fox,flat --dkv-query-min $setting --top 6 --out /tmp 2>&1 \
      | grep -E "wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|^ *fpa" \
      | grep -v "^ptxas info    : Compiling"
done
bash benchmarks/gpu/bench_knob_ab.sh DKV_QUERY_MIN fpa_125m off on
} | tee $OUT/dkv_query_min_ab.txt
