# On an H200 (six to eight minutes): compiled gradients against xla
# (benchmarks/gradient_check_gpu.py), per-kernel traces of FPA (FoX's fields) and FoX at
# (4, 4096, 12, 64) and (8, 2048, 16, 128) and of the gated delta rule at (4, 4096, 16, 128)
# with both WY backwards (benchmarks/op_trace.py, ptxas register and spill lines kept), the
# gated delta rule's bf16 accuracy against a float32 recurrence, ours and fla's
# (benchmarks/gated_delta_gpu_accuracy.py), the short convolution's two implementations with
# their per-kernel device time (benchmarks/short_conv_gpu.py --trace), then the 125M trainer
# benchmark of FPA and FoX at context 2048. Knobs: SHAPES, FIELDS, CHECK_OPS, INTRA, GDN_TOP, PRESETS ("" skips the
# trainer). Needs the wheels of grain, array_record, portpicker and tensorboardX (the trainer)
# and fla (the accuracy comparison) in .whl/; writes to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
SHAPES=${SHAPES:-4,4096,12,64 8,2048,16,128}
timeout 90 python3 benchmarks/gradient_check_gpu.py --ops ${CHECK_OPS:-fpa} --dims 64,128 2>&1 \
    | grep -v Warning | tee $OUT/gradient_check.txt
{
MOSAIC_GPU_DUMP_PTXAS=1 timeout 240 python3 benchmarks/op_trace.py fpa --shape $SHAPES --fields ${FIELDS:-fox} --top 5 --out /tmp
timeout 60 python3 benchmarks/op_trace.py fox --shape $SHAPES --top 4 --out /tmp
for intra in ${INTRA:-xla pallas}; do
  echo "gdn WY backward: $intra"
  timeout 50 python3 benchmarks/op_trace.py gdn --shape 4,4096,16,128 --top ${GDN_TOP:-8} --out /tmp \
      --intra-backward $intra
done
} > $OUT/op_traces.txt 2>&1
{ timeout 60 python3 -m benchmarks.gated_delta_gpu_accuracy jax /tmp/gdn_accuracy.npz
  timeout 60 python3 -m benchmarks.gated_delta_gpu_accuracy torch /tmp/gdn_accuracy.npz
} 2>&1 | grep "vs f32" | tee $OUT/gdn_accuracy.txt
timeout 90 python3 benchmarks/short_conv_gpu.py --trace 2>&1 | grep -v Warning | tee $OUT/short_conv.txt
grep -E "WY backward|wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|C7511" $OUT/op_traces.txt | grep -v "^ptxas info    : Compiling"
for preset in ${PRESETS-fpa_125m fox_125m}; do
  timeout 150 python3 -m train bench $preset --context 2048 --batch-size 8 \
      --steps 10 --out $OUT/bench_$preset.json 2>&1 | grep -E "config|ms / step|tokens/s|MFU|compile|peak|error"
done | tee $OUT/trainer_h200.txt
