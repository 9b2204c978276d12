# One H200 call per variant: SpectralShift on the language-model comparison's GDN
# (configs/lmc_h200_gdn.yaml, 12 x 768 on data/prose). benchmarks/spectralshift_demo.py
# --size h200_prose pretrains it at 2048 (300 steps of 32 x 2048), then extends it to 8192 in each
# variant of VARIANTS (100 steps of 8 x 8192, the same tokens for every variant) and measures each:
# slow-band widths and E_write of a needle, held-out loss at 2048, 8192 and 16384, needle
# retrieval at 8192. Measured on 2026-12-03: pretraining and measuring the reference took 385 s,
# most of it compiling (the train step 49 s, then every measure at its own length); pretraining
# again and one variant with its measures did not finish in 560 s. So once
# results/spectralshift_h200/results.json holds the reference row, each call pretrains again
# (same seed and batches) but keeps that row (--reference-from-results) and measures VARIANTS;
# and every call packs JAX's compilation cache into $OUT/spectralshift_jax_cache.tar.gz: copy it
# to .cache/ and carry .cache, and the next call compiles nothing it compiled before:
#   VARIANTS=plain bash benchmarks/gpu/spectralshift_one.sh  carry: [".whl", "data/prose", ".cache"]
#   VARIANTS=ss_k0.5 ...; VARIANTS=ss_k1 ...
# MEASURE_REFERENCE=1 measures the reference again. LIMIT (default 540 s) stops the demo in
# time to pack the cache within a call's 600 s. Commit a call's folder as
# results/spectralshift_h200/; the next call starts from its results.json. The demo rewrites
# results.json and table.md after every variant, so a call stopped by LIMIT keeps what it
# measured; issued again while the machine is warm, the command continues where it stopped. Writes $OUT/spectralshift_h200/ (table.md, results.json, slow_band_gdn.png,
# spectra_gdn.tar.gz: the spectra report's figures, packed, since a call brings back at most 8
# files), the log spectralshift_log.txt and the cache.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
test -d data/prose || { echo "error: data/prose is missing (carry it: benchmarks/prepare_prose_corpus.py)"; exit 2; }
# /tmp/ss (runs, compile cache, results) outlives a call while the machine stays warm, so the
# same command issued again at once continues: finished runs resume at their last step,
# measured variants are skipped (--skip-measured), and the cache is already there.
out=/tmp/ss/out
mkdir -p $out $OUT/spectralshift_h200
reuse=""
if [ ! -f $out/results.json ] && [ -f results/spectralshift_h200/results.json ]; then
    cp results/spectralshift_h200/results.json $out/
fi
[ -f $out/results.json ] && [ -z "$MEASURE_REFERENCE" ] && reuse=--reference-from-results
[ -d /tmp/ss/jax_cache ] || { [ -f .cache/spectralshift_jax_cache.tar.gz ] && tar -xzf .cache/spectralshift_jax_cache.tar.gz -C /tmp/ss; }
echo "warm state: $(ls /tmp/ss/gdn 2>/dev/null | tr '\n' ' ')"
timeout ${LIMIT:-540} python3 benchmarks/spectralshift_demo.py --size h200_prose --models gdn \
    --variants ${VARIANTS:-plain} $reuse --skip-measured --out $out --runs /tmp/ss 2>&1 \
    | grep --line-buffered -v "^step" | tee -a $OUT/spectralshift_log.txt | tail -30
dir=$OUT/spectralshift_h200
cp $out/results.json $out/table.md $out/*.png $dir/ 2>/dev/null
[ -d $out/spectra_gdn ] && tar -czf $dir/spectra_gdn.tar.gz -C $out spectra_gdn
tar -czf $OUT/spectralshift_jax_cache.tar.gz -C /tmp/ss jax_cache && du -h $OUT/spectralshift_jax_cache.tar.gz
