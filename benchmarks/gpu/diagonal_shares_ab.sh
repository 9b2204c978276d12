# One H200 call (about six minutes): FPA's diagonal tiles' per-level shares from the
# diagonal-shares kernel against XLA given the dk/dv sweep's coefficients
# (mixer_kernels/mosaic_gpu/attention/backward.py DIAGONAL_SHARES = "kernel" | "dkv").
# Compiled gradients against xla with "dkv" (benchmarks/gradient_check_gpu.py), per-kernel
# traces of the FPA op under both forms, FoX's and flat fields, at SHAPES (benchmarks/op_trace.py,
# ptxas register and spill lines kept: the dk/dv sweep gains a 16 KB float32 tile of shared
# memory with "dkv"), then the fpa_125m trainer bench with "dkv" unless TRAIN="" (the
# "kernel" form's number comes from trainer_contexts.sh in the same lease). Needs the wheels
# of grain, array_record, portpicker and tensorboardX in .whl/; writes to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
SHAPES=${SHAPES:-8,2048,12,64 4,4096,12,64 8,2048,16,128}
timeout 120 python3 benchmarks/gradient_check_gpu.py --ops fpa --dims 64,128 --diagonal-shares dkv \
    2>&1 | grep -v Warning | tee $OUT/gradient_check_dkv.txt
{
for form in dkv kernel; do
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 python3 benchmarks/op_trace.py fpa --shape $SHAPES \
      --fields fox,flat --top 8 --diagonal-shares $form --out /tmp
done
} > $OUT/diagonal_shares_full.txt 2>&1
grep -E "wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores," $OUT/diagonal_shares_full.txt \
    | grep -v "^ptxas info    : Compiling" | tee $OUT/diagonal_shares_ab.txt
gzip -f $OUT/diagonal_shares_full.txt
if [ "${TRAIN-1}" ]; then
  DIAGONAL=dkv timeout ${LIMIT:-150} python3 benchmarks/gpu/train_with_knobs.py bench fpa_125m \
      --context 2048 --batch-size 8 --steps 8 --out $OUT/bench_fpa_125m_diagonal_dkv.json 2>&1 \
      | grep -E "config|ms / step|tokens/s|compile|peak|estimate|error" | tee $OUT/trainer_dkv.txt
fi
