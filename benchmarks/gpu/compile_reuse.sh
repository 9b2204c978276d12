# On an H100 or H200 (about three minutes): how a train step's compile grows with depth. For
# each preset in PRESETS at 3 and 12 layers (LAYERS), benchmarks/compile_profile.py's trace /
# lower / compile seconds, with XLA's dump of the optimised train step summarised by
# benchmarks/compile_dump_summary.py (its size, fusion calls, custom calls and the text they
# take). Needs the wheels of .whl/. Writes $OUT/compile_reuse.txt.
#     bash benchmarks/gpu/compile_reuse.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
for preset in ${PRESETS:-fpa_125m fox_125m softmax_rope_125m}; do
  for layers in ${LAYERS:-3 12}; do
    dump=/tmp/dump_${preset}_$layers
    rm -rf $dump   # a rerun on a warm machine summarises this run's dump only
    XLA_FLAGS="--xla_dump_to=$dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*guarded.*" \
        timeout ${LIMIT:-120} python3 benchmarks/compile_profile.py $preset --layers $layers \
        --out /tmp 2>&1 | grep -E "^\{" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(f\"{r['preset']} layers {r['layers']}: trace {r['trace_s']:.1f} s, lower {r['lower_s']:.1f} s, compile {r['compile_s']:.1f} s\")"
    rc=${PIPESTATUS[0]}
    [ "$rc" != 0 ] && echo "$preset layers $layers: compile_profile rc=$rc (124: past LIMIT)"
    python3 benchmarks/compile_dump_summary.py $dump
  done
done
} | tee $OUT/compile_reuse.txt
