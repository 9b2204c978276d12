# On an H200 (about 2 minutes per preset and variant): `python -m train bench` at context
# 2048 x batch 8 under XLA option sets that may shorten the train step's compile, to weigh the
# compile seconds against the step's milliseconds. Variants (VARIANTS, space-separated):
#   default          the flags as they are
#   cublas_gemms     --xla_gpu_enable_triton_gemm=false: every GEMM through cuBLAS, no Triton
#                    GEMM fusions to emit and autotune
#   autotune_1       --xla_gpu_autotune_level=1: GEMM fusions compiled without trying configs
# Needs the wheels of grain, array_record, portpicker and tensorboardX in .whl/; writes
# bench_<preset>_<variant>.json and xla_compile_flags.txt to $OUT. Knobs: PRESETS, VARIANTS,
# LIMIT (seconds per run).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BASE_FLAGS=$XLA_FLAGS
flags_of() {
  case $1 in
    default) echo "" ;;
    cublas_gemms) echo "--xla_gpu_enable_triton_gemm=false" ;;
    autotune_1) echo "--xla_gpu_autotune_level=1" ;;
    *) echo "error: unknown variant $1" >&2; return 1 ;;
  esac
}
{
for preset in ${PRESETS:-fpa_125m softmax_rope_125m}; do
  for variant in ${VARIANTS:-default cublas_gemms}; do
    extra=$(flags_of $variant) || exit 2
    start=$(date +%s)
    echo "== $preset $variant ($extra)"
    # an XLA_FLAGS of spaces alone stops XLA at start-up: set it only when it names a flag
    if [ -n "$BASE_FLAGS$extra" ]; then export XLA_FLAGS="$BASE_FLAGS $extra"; else unset XLA_FLAGS; fi
    timeout ${LIMIT:-200} python3 -m train bench $preset \
        --context 2048 --batch-size 8 --steps 8 --out $OUT/bench_${preset}_$variant.json 2>&1 \
        | grep -E "ms / step|tokens/s|compile|init|error" || echo "$preset $variant: no result"
    echo "  ($preset $variant: $(( $(date +%s) - start )) s in all)"
  done
done
} | tee $OUT/xla_compile_flags.txt
