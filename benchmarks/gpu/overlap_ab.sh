# On an H200 (about eight minutes): the backward sweeps' matmul schedule, sequential against
# overlapped (the scores' and dP's matmuls issued together, P formed while dP's is in flight;
# mixer_kernels/mosaic_gpu/attention/backward.py OVERLAP, here forced for every bias mode). Compiled gradients of the
# overlapped kernels against "xla" first, then per-kernel traces (benchmarks/op_trace.py, ptxas
# register and spill lines kept) of FPA (FoX's and flat fields), FoX and softmax at each shape
# in SHAPES under each schedule in SCHEDULES (none, dq, dkv, both). Writes overlap_ab.txt
# (and the full log) to $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
SHAPES=${SHAPES:-4,4096,12,64 8,2048,16,128}
python3 - <<'PY' 2>&1 | grep -v Warning | tee $OUT/gradient_check_overlap.txt
import sys
from mixer_kernels.mosaic_gpu.attention import backward
backward.OVERLAP = {mode: (True, True) for mode in backward.OVERLAP}
sys.argv = ["gradient_check_gpu.py", "--ops", "fpa,fox", "--dims", "64,128"]
import runpy
runpy.run_path("benchmarks/gradient_check_gpu.py", run_name="__main__")
PY
{
for schedule in ${SCHEDULES:-none dq both}; do
  echo "=== schedule: $schedule"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 python3 benchmarks/op_trace.py fpa --shape $SHAPES \
      --fields fox,flat --top 5 --overlap $schedule --out /tmp
  timeout 60 python3 benchmarks/op_trace.py fox --shape $SHAPES --top 4 --overlap $schedule --out /tmp
  timeout 60 python3 benchmarks/op_trace.py softmax --shape $SHAPES --top 4 --overlap $schedule --out /tmp
done
} > $OUT/overlap_ab_full.txt 2>&1
grep -E "=== schedule|wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|C7511" $OUT/overlap_ab_full.txt \
    | grep -v "^ptxas info    : Compiling" | tee $OUT/overlap_ab.txt
