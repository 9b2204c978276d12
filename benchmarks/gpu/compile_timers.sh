# On an H200: XLA's own timers (its scoped logging timers at VLOG 1 in the GPU compiler's
# files) while benchmarks/compile_profile.py compiles each preset in PRESETS, summed by timer
# label: which compiler stages (HLO passes, LLVM IR emission, LLVM to PTX, ptxas) take a
# train step's compile time. LAYERS="3 12" compiles each preset at each depth in turn (files
# named <preset>_L<layers>). Needs the wheels of .whl/. Writes $OUT/compile_timers_<name>.txt
# (benchmarks/compile_timer_summary.py) and compile_timers_<name>.log.gz (the whole log).
#     LAYERS="3 12" PRESETS="fpa_125m softmax_rope_125m" bash benchmarks/gpu/compile_timers.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=0
export TF_CPP_VMODULE=${VMODULE:-gpu_compiler=1,nvptx_compiler=1,compile_module_to_llvm_ir=1,hlo_pass_pipeline=1,autotuner_util=1,gemm_fusion_autotuner=1,ptx_compiler_impl=1,subprocess_compilation=1}
for preset in ${PRESETS:-fpa_125m softmax_rope_125m}; do
  for layers in ${LAYERS:-0}; do   # LAYERS="3 12": each depth in turn (0: the preset's own)
    name=$preset; depth=""
    [ "$layers" != 0 ] && name=${preset}_L$layers && depth="--layers $layers"
    mkdir -p /tmp/cp_$name
    timeout ${LIMIT:-200} python3 benchmarks/compile_profile.py $preset $depth ${ARGS} \
        --out /tmp/cp_$name > /tmp/compile_$name.log 2>&1
    echo "== $name rc=$?"; grep -A8 "^| preset\|^preset" /tmp/compile_$name.log | head -12
    gzip -c /tmp/compile_$name.log > $OUT/compile_timers_$name.log.gz
    python3 benchmarks/compile_timer_summary.py /tmp/compile_$name.log --top ${TOP:-25} \
        | tee $OUT/compile_timers_$name.txt
  done
done
