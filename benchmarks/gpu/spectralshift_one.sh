# One H200 call (estimated, not yet measured: about ten minutes): SpectralShift on the
# language-model comparison's GDN (configs/lmc_h200_gdn.yaml, 12 x 768 on data/prose).
# benchmarks/spectralshift_demo.py --size h200_prose pretrains it at 2048 (300 steps of 32 x 2048),
# measures it, then extends it to 8192 in each variant of VARIANTS (100 steps of 8 x 8192, the same
# tokens for every variant) and measures each: slow-band widths and E_write of a needle, held-out
# loss at 2048, 8192 and 16384, needle retrieval at 8192.
#   VARIANTS="plain ss_k0.5" bash benchmarks/gpu/spectralshift_one.sh    carry: [".whl", "data/prose"]
#   VARIANTS="ss_k1" bash benchmarks/gpu/spectralshift_one.sh            (a second call)
# Checkpoints cannot leave the machine, so each call pretrains the reference again (same seed and
# batches). Commit a call's folder as results/spectralshift_h200/ and the next call starts from its
# results.json, adding its variants' rows to the same table. The demo rewrites results.json and
# table.md after every variant, so a call stopped by LIMIT keeps what it measured. Writes $OUT/spectralshift_h200/ (table.md, results.json,
# slow_band_gdn.png, spectra_gdn.tar.gz: one figure per layer, packed, since a call brings back
# at most 8 files) and the log spectralshift_log.txt.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
test -d data/prose || { echo "error: data/prose is missing (carry it: benchmarks/prepare_prose_corpus.py)"; exit 2; }
mkdir -p $OUT/spectralshift_h200
[ -f results/spectralshift_h200/results.json ] && cp results/spectralshift_h200/results.json $OUT/spectralshift_h200/
timeout ${LIMIT:-570} python3 benchmarks/spectralshift_demo.py --size h200_prose --models gdn \
    --variants ${VARIANTS:-plain ss_k0.5} --out $OUT/spectralshift_h200 --runs /tmp/ss 2>&1 \
    | grep -v "^step" | tee $OUT/spectralshift_log.txt | tail -30
dir=$OUT/spectralshift_h200
[ -d $dir/spectra_gdn ] && tar -czf $dir/spectra_gdn.tar.gz -C $dir spectra_gdn && rm -rf $dir/spectra_gdn
