# On an H100 or H200 (about four minutes): why the FPA backward sweeps cost more than FoX's.
# Nsight Compute's speed-of-light, warp-stall, occupancy and instruction-mix sections and the
# stall reasons per issued instruction (smsp__average_warps_issue_stalled_*) for the dq,
# dk/dv (and FPA's diagonal-shares) kernels of FPA (FoX's fields) and of FoX at SHAPE, side by side; then the
# optimised HLO of FoX's and softmax's forward+backward, for the XLA passes between kernels.
# Writes to $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
SHAPE=${SHAPE:-8,2048,12,64}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
profile() {  # name, op_trace arguments
  local name=$1; shift
  timeout 200 $NCU --clock-control none -k regex:'attention_(dq|dkv|diagonal)' --launch-count 3 $SECTIONS \
    --metrics regex:'smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 benchmarks/op_trace.py "$@" --shape $SHAPE --repeats 1 --out /tmp > $OUT/ncu_$name.txt 2>&1
  echo "== $name rc=$?"
}
profile fpa_fox fpa --fields fox
profile fox fox
for op in fox softmax; do
  XLA_FLAGS="--xla_dump_to=/tmp/hlo_$op --xla_dump_hlo_as_text" timeout 120 \
    python3 benchmarks/op_trace.py $op --shape $SHAPE --repeats 1 --top 8 --out /tmp 2>&1 | grep -v Warning
  mkdir -p $OUT/hlo_$op
  for f in $(grep -l "transpose_fusion" /tmp/hlo_$op/*after_optimizations.txt); do cp $f $OUT/hlo_$op/; done
done
gzip -f $OUT/hlo_*/*.txt 2>/dev/null
