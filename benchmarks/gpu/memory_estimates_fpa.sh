# On an H200: FPA's memory estimate vs the allocator peak, and an
# unrefused out-of-memory case (the refusal switched off) to see XLA's error mapped to one line.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 -m benchmarks.memory_check --one '["fpa_125m", 2048, 8, 32768, true]' > $OUT/fpa_case.txt 2>&1; echo "fpa case rc=$?" >> $OUT/fpa_case.txt
timeout 200 python3 -m benchmarks.memory_check --one '["gdn_125m", 2048, 1024, 32768, false]' > $OUT/oom_case.txt 2>&1; echo "oom case rc=$?" >> $OUT/oom_case.txt
tail -c 1500 $OUT/fpa_case.txt; tail -c 1500 $OUT/oom_case.txt
