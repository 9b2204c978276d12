# On an H200 (about five minutes): FPA's field passes in the field kernels
# (mixer_kernels/mosaic_gpu/attention/fields_kernels.py, FIELD_PASSES = "kernels") against the
# XLA form level by level. Per form (FORMS): the 125M train step's compile split, FPA and
# softmax in one process (benchmarks/compile_profile.py), and per-kernel traces of the FPA op,
# FoX's and flat fields, at SHAPES (benchmarks/op_trace.py, ptxas register and spill lines
# kept). CHECK=1 first runs the compiled gradients against xla (benchmarks/gradient_check_gpu.py),
# ANCHORS="fox softmax" traces those ops too. Needs the wheels of grain, array_record,
# portpicker and tensorboardX in .whl/ (the train step); writes to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
SHAPES=${SHAPES:-8,2048,12,64}
if [ -n "$CHECK" ]; then
  timeout 120 python3 benchmarks/gradient_check_gpu.py --ops fpa --dims 64,128 2>&1 \
      | grep -v Warning | tee $OUT/gradient_check.txt
fi
{
for passes in ${FORMS:-kernels by_level}; do
  echo "=== field passes: $passes"
  timeout 150 python3 benchmarks/compile_profile.py fpa_125m softmax_rope_125m \
      --field-passes $passes --out /tmp 2>&1 | grep -v -i warning | tail -4
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 python3 benchmarks/op_trace.py fpa --shape $SHAPES \
      --fields fox,flat --top 8 --field-passes $passes --out /tmp
done
for op in $ANCHORS; do
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 python3 benchmarks/op_trace.py $op --shape $SHAPES --top 5 --out /tmp
done
} > $OUT/field_kernels_full.txt 2>&1
grep -E "===|\"preset\"|wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|^ *(fpa|softmax)_" \
    $OUT/field_kernels_full.txt | grep -v "^ptxas info    : Compiling" | tee $OUT/field_kernels_ab.txt
gzip -f $OUT/field_kernels_full.txt
