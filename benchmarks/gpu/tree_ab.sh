# On an H200 (about six minutes): this tree's attention kernels against another tree's, on the
# same machine in one run. BASE_DIR holds the other tree's packages (made on the workstation,
# an ignored folder carried with the call):
#     mkdir -p .ab_base && git archive REV mixer_core mixer_kernels fpa_jax gdn_jax train benchmarks \
#         | tar -x -C .ab_base            # then carry ".ab_base"
# This tree's compiled gradients against "xla" first (benchmarks/gradient_check_gpu.py), then
# per tree the per-kernel traces (benchmarks/op_trace.py) of FPA (FoX's and flat fields), FoX
# and softmax at SHAPES, with ptxas's register and spill lines. Writes to $OUT.
BASE_DIR=${BASE_DIR:-.ab_base}
SHAPES=${SHAPES:-8,2048,12,64}
[ -d "$BASE_DIR/mixer_kernels" ] || { echo "error: BASE_DIR=$BASE_DIR holds no tree"; exit 2; }
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 150 python3 benchmarks/gradient_check_gpu.py --ops fpa,fox,softmax --dims 64,128 2>&1 \
    | grep -v Warning | tee $OUT/gradient_check.txt
trace() {   # trace TREE: the op traces of the tree at $1
  for op in fpa fox softmax; do
    fields=""; [ $op = fpa ] && fields="--fields fox,flat"
    (cd "$1" && PYTHONPATH=$PWD MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 \
        python3 benchmarks/op_trace.py $op --shape $SHAPES $fields --top 6 --out /tmp)
  done
}
{
  echo "=== tree: this"; trace "$PWD"
  echo "=== tree: base ($BASE_DIR)"; trace "$(cd "$BASE_DIR" && pwd)"
} > $OUT/tree_ab_full.txt 2>&1
grep -E "===|wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|^ *(fpa|fox|softmax)" \
    $OUT/tree_ab_full.txt | grep -v "^ptxas info    : Compiling" | tee $OUT/tree_ab.txt
gzip -f $OUT/tree_ab_full.txt
