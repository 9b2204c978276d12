# On an H200: train/core/memory.py's estimate against the allocator peak, via
# `train bench` (estimate beside the peak) and benchmarks/memory_check.py (one subprocess per
# case, an unrefused out-of-memory case to see XLA's error mapped to one line).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
L=$OUT/memory_h200.txt
timeout 170 python3 -m benchmarks.memory_check --one '["gdn_125m", 2048, 8, 32768, true]' > $OUT/one_case.txt 2>&1; echo "one case rc=$?" >> $L
tail -c 3000 $OUT/one_case.txt >> $L
for p in fpa_125m gdn_125m hybrid_125m; do
  timeout 100 python3 -m train bench $p --context 2048 --batch-size 8 --steps 3 --warmup 1 --out $OUT/bench_$p.json 2>&1 | grep -E "config|context|peak|estimate|compile|error" >> $L || echo "bench $p rc=$?" >> $L
done
timeout 200 python3 -m benchmarks.memory_check --out $OUT --presets gdn_125m --seq-lens 2048 --batch-sizes 32 --vocab 32768 --oom-batch 2048 --case-timeout 95 >> $L 2>&1; echo "memory_check rc=$?" >> $L
cat $L
