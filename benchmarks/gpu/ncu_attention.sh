# On an H200: Nsight Compute launch statistics (registers, spills to local memory, pipe
# counts) of the FPA attention kernels in the flat and FoX-field regimes at (4, 4096, 12, 64),
# then per-kernel trace times of FPA (three regimes), FoX and softmax at the three shapes
# (benchmarks/op_trace.py). Writes to $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
profile() {  # name, op_trace arguments
  local name=$1; shift
  timeout 120 $NCU --clock-control none -k regex:attention --launch-count 3 --section LaunchStats \
    --metrics gpu__time_duration.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum \
    python3 benchmarks/op_trace.py "$@" --repeats 1 --out /tmp > $OUT/ncu_$name.txt 2>&1
  echo "== $name rc=$?"; grep -E "attention_|gpu__time|Registers Per|local_op|pipe_xu|inst_executed.sum" $OUT/ncu_$name.txt | head -40
}
profile fpa_flat fpa --shape 4,4096,12,64 --fields flat
profile fpa_fox fpa --shape 4,4096,12,64 --fields fox
SHAPES=${SHAPES:-4,4096,12,64 1,16384,12,64 8,2048,16,128}
{
timeout 300 python3 benchmarks/op_trace.py fpa --shape $SHAPES --fields walk,flat,fox --top 4 --out /tmp
timeout 120 python3 benchmarks/op_trace.py fox --shape $SHAPES --top 4 --out /tmp
timeout 120 python3 benchmarks/op_trace.py softmax --shape $SHAPES --top 4 --out /tmp
} 2>&1 | grep -v Warning | tee $OUT/op_traces.txt
