# SpectralShift on the language-model comparison's GDN (configs/lmc_h200_gdn.yaml, 12 x 768 on
# data/prose) on one H200. benchmarks/spectralshift_demo.py --size h200_prose pretrains it at
# 2048 (300 steps of 32 x 2048), then extends it to 8192 in each variant of VARIANTS (100 steps
# of 8 x 8192, the same tokens for every variant) and measures each: slow-band widths and
# E_write of a needle, held-out loss at 2048, 8192 and 16384, needle retrieval at 8192.
#   VARIANTS="plain ss_k0.5 ss_k1" LIMIT=545 bash benchmarks/gpu/spectralshift_one.sh
#       (wheels in .whl/, corpus in data/prose); then the same command again, at once,
#       until the table has every row
# Timing (H200, 2026-12-03): pretraining and measuring the reference take 385 s, most of it
# compiling (the train step 49-62 s, then every measure at its own length); a run that keeps
# the reference row (results/spectralshift_h200/results.json, --reference-from-results)
# pretrains in 277 s and trains the plain variant (compile 45 s) within 545 s, so one variant
# takes more than one run at LIMIT=545. The runs, JAX's compilation cache and the results live
# in /tmp/ss, which stays on the machine between runs, so the same command run again
# continues: finished runs resume at their last step (21 s for both), measured variants are
# skipped (--skip-measured), and nothing compiled before compiles again (the cache, 41-62 MB,
# stays in /tmp/ss and is not copied to $OUT). Without /tmp/ss (a fresh machine) the script
# starts over (pretraining again, same seed and batches).
# MEASURE_REFERENCE=1 measures the reference again. The demo rewrites results.json and table.md
# after every variant, so a run stopped by LIMIT keeps what it measured. Writes
# $OUT/spectralshift_h200/ (table.md, results.json, slow_band_gdn.png, spectra_gdn.tar.gz: the
# spectra report's figures, packed into one file) and the log spectralshift_log.txt (every
# 100th step line); commit the folder as results/spectralshift_h200/.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
test -d data/prose || { echo "error: data/prose is missing (build it with benchmarks/prepare_prose_corpus.py)"; exit 2; }
out=/tmp/ss/out
mkdir -p $out $OUT/spectralshift_h200
reuse=""
if [ ! -f $out/results.json ] && [ -f results/spectralshift_h200/results.json ]; then
    cp results/spectralshift_h200/results.json $out/
fi
[ -f $out/results.json ] && [ -z "$MEASURE_REFERENCE" ] && reuse=--reference-from-results
echo "warm state: $(ls /tmp/ss/gdn 2>/dev/null | tr '\n' ' ')"
timeout ${LIMIT:-540} python3 benchmarks/spectralshift_demo.py --size h200_prose --models gdn \
    --variants ${VARIANTS:-plain} $reuse --skip-measured --out $out --runs /tmp/ss 2>&1 \
    | awk '!/^step / || /^step [1-9][0-9]*00\// {print; fflush()}' \
    | tee -a $OUT/spectralshift_log.txt | tail -30
dir=$OUT/spectralshift_h200
cp $out/results.json $out/table.md $out/*.png $dir/ 2>/dev/null
[ -d $out/spectra_gdn ] && tar -czf $dir/spectra_gdn.tar.gz -C $out spectra_gdn
