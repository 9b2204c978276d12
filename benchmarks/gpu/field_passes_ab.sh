# On an H200 (about six minutes): FPA's XLA field passes level by level against every level
# at once (mixer_kernels/mosaic_gpu/attention/fields.py FIELD_PASSES). For each form: the
# 125M train step's compile split (benchmarks/compile_profile.py, FPA and softmax in one
# process), then per-kernel traces of the FPA op at (4, 4096, 12, 64) and (8, 2048, 12, 64),
# FoX's and flat fields; last, the trainer benchmark of fpa_125m under "all_levels" (the
# default form's number comes from any other run). Writes field_passes_ab.txt to $OUT.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
{
for passes in by_level all_levels; do
  echo "=== field passes: $passes"
  timeout 120 python3 benchmarks/compile_profile.py fpa_125m softmax_rope_125m \
      --field-passes $passes --out /tmp 2>&1 | grep -v -i warning | tail -4
  timeout 100 python3 benchmarks/op_trace.py fpa --shape 4,4096,12,64 8,2048,12,64 \
      --fields fox,flat --top 8 --field-passes $passes --out /tmp 2>&1 \
      | grep -E "wall median|  [0-9.]+ ms"
done
echo "=== trainer, all_levels"
timeout ${LIMIT:-150} python3 - <<PY 2>&1 | grep -E "config|ms / step|tokens/s|MFU|compile|peak|rror"
from mixer_kernels.mosaic_gpu.attention import fields
fields.FIELD_PASSES = "all_levels"
import runpy, sys
sys.argv = ["train", "bench", "fpa_125m", "--context", "2048", "--batch-size", "8", "--steps", "10",
            "--out", "$OUT/bench_fpa_125m_all_levels.json"]
runpy.run_module("train", run_name="__main__")
PY
} 2>&1 | tee $OUT/field_passes_ab.txt
