# One H200 call (about seven minutes): the attention backward in one sweep (the dk/dv kernel
# also forms dq and the row sums, added into float32 accumulators by TMA reductions;
# mixer_kernels/mosaic_gpu/attention/backward.py ONE_SWEEP, here forced for every bias mode)
# against two sweeps. Compiled gradients of the one-sweep kernels against "xla" first, then
# per-kernel traces (benchmarks/op_trace.py, ptxas register and spill lines kept) of FPA (FoX's
# and flat fields), FoX and softmax at each shape in SHAPES, two sweeps then one; then, for each
# preset in PRESETS (default fpa_125m; "" skips), the trainer benchmark with one sweep.
# Writes one_sweep_ab.txt (and the full log) to $OUT.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
SHAPES=${SHAPES:-4,4096,12,64 8,2048,16,128}
force='from mixer_kernels.mosaic_gpu.attention import backward
backward.ONE_SWEEP = {mode: True for mode in backward.ONE_SWEEP}
import runpy, sys'
python3 - <<PY 2>&1 | grep -v Warning | tee $OUT/gradient_check_one_sweep.txt
$force
sys.argv = ["gradient_check_gpu.py", "--ops", "fpa,fox", "--dims", "64,128"]
runpy.run_path("benchmarks/gradient_check_gpu.py", run_name="__main__")
PY
{
for sweep in ${SWEEPS:-off on}; do
  echo "=== one sweep: $sweep"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 python3 benchmarks/op_trace.py fpa --shape $SHAPES \
      --fields fox,flat --top 6 --one-sweep $sweep --out /tmp
  timeout 60 python3 benchmarks/op_trace.py fox --shape $SHAPES --top 5 --one-sweep $sweep --out /tmp
  timeout 60 python3 benchmarks/op_trace.py softmax --shape $SHAPES --top 5 --one-sweep $sweep --out /tmp
done
} > $OUT/one_sweep_ab_full.txt 2>&1
grep -E "=== one sweep|wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|C7511|Error|error" \
    $OUT/one_sweep_ab_full.txt | grep -v "^ptxas info    : Compiling" | tee $OUT/one_sweep_ab.txt
for preset in ${PRESETS-fpa_125m}; do
  timeout ${LIMIT:-150} python3 - <<PY 2>&1 | grep -E "config|ms / step|tokens/s|MFU|compile|peak|rror"
$force
sys.argv = ["train", "bench", "$preset", "--context", "2048", "--batch-size", "8", "--steps", "10",
            "--out", "$OUT/bench_one_sweep_$preset.json"]
runpy.run_module("train", run_name="__main__")
PY
done | tee $OUT/trainer_one_sweep.txt
