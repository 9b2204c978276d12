# On an H200 (about eight and a half minutes: each bench takes 76-97 s with its start-up and
# compile): `python -m train bench` at context 2048, batch 8, of fpa_125m, fox_125m and
# softmax_rope_125m, each with the blocks unrolled (model.scan_layers=false, the default) and as
# one lax.scan over the pattern's repeats (model.scan_layers=true): tokens/s, compile seconds and
# peak memory of each in one run (softmax unrolled is the anchor). Needs the wheels of grain,
# array_record, portpicker and tensorboardX in .whl/. Writes scan_layers_ab.txt and
# bench_<preset>_scan_<bool>.json to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
for run in fpa_125m:false fpa_125m:true fox_125m:false fox_125m:true softmax_rope_125m:false \
           softmax_rope_125m:true; do
  preset=${run%%:*}; scan=${run#*:}
  echo "=== $preset, model.scan_layers=$scan"
  start=$(date +%s)
  timeout ${LIMIT:-120} python3 -m train bench $preset --context 2048 --batch-size 8 --steps 8 \
      model.scan_layers=$scan --out $OUT/bench_${preset}_scan_$scan.json 2>&1 \
      | grep -E "ms / step|tokens/s|compile|peak|error" || echo "no result"
  echo "  ($(( $(date +%s) - start )) s in all)"
done
} 2>&1 | tee $OUT/scan_layers_ab.txt
