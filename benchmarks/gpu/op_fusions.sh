# On an H100 or H200 (about two minutes per op): which JAX operation each costly XLA fusion of
# an op's forward+backward comes from. For each op in OPS (op_trace.py's: gdn, fpa, fox,
# softmax) at SHAPE: one op_trace run with the optimised HLO dumped and command buffers off
# (so the trace names each fusion), then benchmarks/fusion_sources.py joins the two. Writes
# fusions_<op>.txt to $OUT.
#   OPS="gdn" SHAPE=4,4096,16,128 bash benchmarks/gpu/op_fusions.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
SHAPE=${SHAPE:-4,4096,16,128}
for op in ${OPS:-gdn}; do
  rm -rf /tmp/fusions_$op && mkdir -p /tmp/fusions_$op/hlo
  XLA_FLAGS="--xla_dump_to=/tmp/fusions_$op/hlo --xla_dump_hlo_as_text --xla_gpu_enable_command_buffer=" \
    timeout 150 python3 benchmarks/op_trace.py $op --shape $SHAPE --fields fox --repeats 3 \
    --top 20 --keep-trace --out /tmp/fusions_$op 2>&1 | grep -E "wall median|  [0-9.]+ ms|rror"
  for trace in /tmp/fusions_$op/trace_*; do
    python3 benchmarks/fusion_sources.py $trace /tmp/fusions_$op/hlo --steps 3 --top 25
  done > $OUT/fusions_$op.txt 2>&1
  cat $OUT/fusions_$op.txt
done
