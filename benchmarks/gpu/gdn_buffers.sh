# On an H200 (about three minutes): where the peak memory of the gdn_125m train step goes. Compiles
# and runs `python -m train bench gdn_125m` at 2048 x 8 with XLA's dump on, then keeps the train
# step's buffer assignment and memory-usage report (the largest live buffers at the peak, with the
# HLO instruction that makes each). Needs the wheels in .whl/; RESIDUALS=internals (and the other
# switches of benchmarks/gpu/with_knobs.py) picks the GDN op's residuals. Writes gdn_buffers.txt (the bench
# and the report's head) and gdn_buffers.tar.gz (the report and buffer assignment) to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
dump=/tmp/gdn_dump
XLA_FLAGS="--xla_dump_to=$dump --xla_dump_hlo_as_text" timeout ${LIMIT:-300} python3 \
    benchmarks/gpu/with_knobs.py -m train bench \
    gdn_125m --context 2048 --batch-size 8 --steps 2 --warmup 1 --out $OUT/bench_gdn_125m_dump.json \
    2>&1 | grep -E "ms / step|tokens/s|compile|peak|estimate|error" | tee $OUT/gdn_buffers.txt
# the train step is `jit_guarded` (train/core/session.py); the largest such report if it compiled twice
report=$(ls -S $dump/*jit_guarded*memory-usage-report.txt 2>/dev/null | head -1)
[ -n "$report" ] || { echo "error: no memory-usage report of the train step (jit_guarded) in $dump"; exit 1; }
module=$(basename $report | cut -d. -f1)
{ echo "=== ${report##*/}"; head -120 $report; } | tee -a $OUT/gdn_buffers.txt
tar -czf $OUT/gdn_buffers.tar.gz -C $dump $(cd $dump && ls -d $module.*-memory-usage-report.txt \
    $module.*-buffer-assignment.txt $module.*_after_optimizations.txt)
