# On an H200: XLA's own timers (its scoped logging timers at VLOG 1 in the GPU compiler's
# files) while benchmarks/compile_profile.py compiles each preset in PRESETS, summed by timer
# label: which compiler stages (HLO passes, LLVM IR emission, LLVM to PTX, ptxas) take a
# train step's compile time. Needs the wheels of .whl/. Writes $OUT/compile_timers_<preset>.txt
# (benchmarks/compile_timer_summary.py) and compile_timers_<preset>.log.gz (the whole log).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=0
export TF_CPP_VMODULE=${VMODULE:-gpu_compiler=1,nvptx_compiler=1,compile_module_to_llvm_ir=1,hlo_pass_pipeline=1,autotuner_util=1,gemm_fusion_autotuner=1,ptx_compiler_impl=1,subprocess_compilation=1}
for preset in ${PRESETS:-fpa_125m softmax_rope_125m}; do
  mkdir -p /tmp/cp_$preset
  timeout ${LIMIT:-200} python3 benchmarks/compile_profile.py $preset ${ARGS} --out /tmp/cp_$preset \
      > /tmp/compile_$preset.log 2>&1
  echo "== $preset rc=$?"; grep -A8 "^| preset\|^preset" /tmp/compile_$preset.log | head -12
  gzip -c /tmp/compile_$preset.log > $OUT/compile_timers_$preset.log.gz
  python3 benchmarks/compile_timer_summary.py /tmp/compile_$preset.log --top ${TOP:-25} \
      | tee $OUT/compile_timers_$preset.txt
done
