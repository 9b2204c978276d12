# On an H200: bf16 gradient precision (with fla's FoX kernel as the anchor) and the
# memory estimate against the allocator peak. Run from the repo root with the wheels
# of grain, array_record, tensorboardX, fla-core and flash-linear-attention in .whl/.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv
timeout 330 python3 -m benchmarks.bf16_gradients --seeds 3 --json $OUT/bf16_gradients_h200.json 2>&1 | grep -v Warning | tee $OUT/bf16_gradients_h200.txt
timeout 240 python3 -m benchmarks.memory_check --out $OUT --presets fpa_125m,gdn_125m --seq-lens 2048 --batch-sizes 8,32 --vocab 32768 --oom-batch 1024 2>&1 | tee $OUT/memory_check_h200.txt
