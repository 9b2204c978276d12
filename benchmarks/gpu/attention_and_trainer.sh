# One H200 call: the attention table (FPA in three field regimes, FoX, softmax, cuDNN; fla's
# FoX and PyTorch SDPA in a PyTorch process) and the 125M trainer benchmarks at context 2048
# (FPA, FoX, softmax+RoPE, GDN, hybrid: tokens/s, MFU, compile seconds). Run from the repo root
# with the wheels of grain, array_record, portpicker, tensorboardX, fla-core and
# flash-linear-attention in .whl/; writes its tables and JSON to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 280 python3 benchmarks/bench_attention.py --device gpu --no-xla --memory-lengths "" \
    --anchor "fox pallas" --json $OUT/attention_h200.json 2>&1 | grep -v Warning | tee $OUT/attention_h200.txt
for preset in ${PRESETS:-fpa_125m fox_125m softmax_rope_125m gdn_125m hybrid_125m}; do
  timeout 110 python3 -m train bench $preset --context ${CONTEXT:-2048} --batch-size ${BATCH:-8} \
      --steps 10 --out $OUT/bench_$preset.json 2>&1 | grep -E "config|ms / step|tokens/s|MFU|compile|peak|error"
done | tee $OUT/trainer_h200.txt
