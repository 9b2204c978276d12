# On an H200 (about five and a half minutes): the attention table of docs/benchmarks.md. FPA in
# three field regimes (drifting walk, FoX's fields, flat), FoX, softmax and cuDNN in JAX; fla's
# FoX and PyTorch SDPA in a PyTorch process; each shape's pruned-tile fractions in a third
# process. On 2026-12-03 the PyTorch process and 1.5 of the three shapes took 230 s. Run from the
# repo root with the wheels of fla-core and flash-linear-attention in .whl/; writes
# attention_h200.{txt,json} and attention_h200_extras.json to $OUT. The 125M trainer benchmarks
# are benchmarks/gpu/trainer_contexts.sh (a separate run: each preset takes 76-97 s there).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout ${LIMIT:-540} python3 benchmarks/bench_attention.py --device gpu --no-xla --memory-lengths "" \
    --anchor "fox pallas" --json $OUT/attention_h200.json 2>&1 | grep -v Warning | tee $OUT/attention_h200.txt
