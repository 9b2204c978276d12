# One H200 call (about eight minutes): the attention kernels under Mosaic GPU's two lowering
# semantics. "warpgroup" (jax's default: Mosaic infers the register layouts, a Python
# constraint solver that takes most of the kernels' lowering time) against "lane" (the layouts
# the kernels already state; no inference). For each: compiled gradients against xla (lane),
# per-kernel device time of FPA (FoX's and flat fields) and FoX at (4, 4096, 12, 64), and the
# fpa_125m trainer benchmark (compile seconds, tokens/s); under warpgroup also FPA with its
# row / column sums after the dk and dq matmuls (op_trace.py --overlap-sums off). "lane" is applied by editing this
# machine's copy of kernels_pallas/attention/common.py (COMPILER_PARAMS). Needs the wheels of
# grain, array_record, portpicker and tensorboardX in .whl/; writes lowering_<name>.txt and
# bench_fpa_125m_<name>.json to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
COMMON=kernels_pallas/attention/common.py
for lowering in ${ORDER:-warpgroup lane}; do
  if [ $lowering = lane ]; then
    sed -i 's/^COMPILER_PARAMS = plgpu.CompilerParams(approx_math=True)$/COMPILER_PARAMS = plgpu.CompilerParams(approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Lane)/' $COMMON
    grep -q "LoweringSemantics.Lane" $COMMON || { echo "error: $COMMON was not switched to lane"; exit 2; }
    timeout 90 python3 benchmarks/gradient_check_gpu.py --ops fpa,fox --dims 64,128 2>&1 | grep -v Warning
  fi
  {
  echo "== lowering: $lowering"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 120 python3 benchmarks/op_trace.py fpa --shape 4,4096,12,64 --fields fox,flat --top 5 --out /tmp 2>&1 \
      | grep -E "wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|C7511|rror" | grep -v "^ptxas info    : Compiling"
  if [ $lowering = warpgroup ]; then   # the sums after the dk / dq matmul (OVERLAP_SUMS off)
    echo "-- overlap sums: off"
    MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 python3 benchmarks/op_trace.py fpa --shape 4,4096,12,64 --fields fox --top 5 --out /tmp \
        --overlap-sums off 2>&1 | grep -E "wall median|  [0-9.]+ ms|Used [0-9]+ reg|spill stores,|C7511|rror" | grep -v "^ptxas info    : Compiling"
  fi
  timeout 60 python3 benchmarks/op_trace.py fox --shape 4,4096,12,64 --top 4 --out /tmp 2>&1 | grep -E "wall median|  [0-9.]+ ms|rror"
  timeout 170 python3 -m train bench fpa_125m --context 2048 --batch-size 8 --steps 10 \
      --out $OUT/bench_fpa_125m_$lowering.json 2>&1 | grep -E "ms / step|tokens/s|compile|error"
  } | tee $OUT/lowering_$lowering.txt
done
