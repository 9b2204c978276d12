# `python -m train bench PRESET` at 2048 x 8 (8 steps) once per VALUE of the environment switch
# KNOB (benchmarks/gpu/with_knobs.py), one after the other on the same machine. Needs the
# wheels of .whl/ for the train step. LIMIT: seconds per run (default 150). Writes
# $OUT/bench_PRESET_KNOB_VALUE.json.
#     bash benchmarks/gpu/bench_knob_ab.sh FIELDS fpa_125m by_level kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
knob=$1 preset=$2
shift 2
for value in "$@"; do
  echo "=== $knob=$value: $preset at 2048 x 8"
  env "$knob=$value" timeout ${LIMIT:-150} python3 benchmarks/gpu/with_knobs.py -m train bench \
      $preset --context 2048 --batch-size 8 --steps 8 --out $OUT/bench_${preset}_${knob}_$value.json \
      2>&1 | grep -E "ms / step|tokens/s|compile|error"
done
