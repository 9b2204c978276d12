# On an H200 (about six minutes): this tree's attention kernels against another tree's, on the
# same machine in one run. BASE_DIR holds the other tree's packages (made on the workstation,
# an ignored folder carried with the call):
#     mkdir -p .ab_base && git archive REV mixer_core mixer_kernels fpa_jax gdn_jax train benchmarks \
#         | tar -x -C .ab_base            # then carry ".ab_base"
# This tree's compiled gradients against "xla" first (benchmarks/gradient_check_gpu.py; for
# gdn its bf16 output and gradients against a float32 recurrence,
# benchmarks/gated_delta_gpu_accuracy.py), then per tree the per-kernel traces
# (benchmarks/op_trace.py) of OPS (default: FPA with FoX's and flat fields, FoX and softmax;
# gdn may be named too) at SHAPES, with ptxas's register and spill lines. Writes to $OUT.
#     OPS=gdn SHAPES="8,2048,12,64 4,4096,16,128" BASE_DIR=.ab_base bash benchmarks/gpu/tree_ab.sh
BASE_DIR=${BASE_DIR:-.ab_base}
SHAPES=${SHAPES:-8,2048,12,64}
OPS=${OPS:-fpa fox softmax}
[ -d "$BASE_DIR/mixer_kernels" ] || { echo "error: BASE_DIR=$BASE_DIR holds no tree"; exit 2; }
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
attention=$(echo $OPS | tr ' ' '\n' | grep -v gdn | paste -sd, -)
{
[ -n "$attention" ] && timeout 150 python3 benchmarks/gradient_check_gpu.py --ops $attention \
    --dims 64,128 2>&1 | grep -v Warning
case " $OPS " in *" gdn "*)
  for shape in 4,2048,12,64 2,4096,16,128; do
    PYTHONPATH=$PWD timeout 70 python3 -m benchmarks.gated_delta_gpu_accuracy jax /tmp/a.npz \
        $shape 2>&1 | grep -E "vs f32|rror"
  done;;
esac
} | tee $OUT/gradient_check.txt
trace() {   # trace TREE: the op traces of the tree at $1
  for op in $OPS; do
    fields=""; [ $op = fpa ] && fields="--fields fox,flat"
    (cd "$1" && PYTHONPATH=$PWD MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 \
        python3 benchmarks/op_trace.py $op --shape $SHAPES $fields --top ${TOP:-6} --out /tmp)
  done
}
{
  echo "=== tree: this"; trace "$PWD"
  echo "=== tree: base ($BASE_DIR)"; trace "$(cd "$BASE_DIR" && pwd)"
} > $OUT/tree_ab_full.txt 2>&1
grep -E "===|wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|^ *(fpa|fox|softmax|gdn)" \
    $OUT/tree_ab_full.txt | grep -v "^ptxas info    : Compiling" | tee $OUT/tree_ab.txt
gzip -f $OUT/tree_ab_full.txt
