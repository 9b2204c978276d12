# On an H200 (six to ten minutes per model): train one `lm_compare --size h200` model
# (the paper's shape on the English prose corpus, configs/base/lmc_h200.yaml) and evaluate it
# in the same run; the checkpoints stay in /tmp/runs, only tables, JSON and plots go to $OUT.
#   MODEL=fpa bash benchmarks/gpu/lm_compare_one.sh     # wheels in .whl/, corpus in data/prose
# writes $OUT/lm_compare_<model>/lm_compare.{json,md,png} and train_log.txt; afterwards
#   python -m train.experiments.lm_compare --merge results/lm_compare_h200/*/lm_compare.json --out DIR
# builds the comparison (with FoX's run among them).
# DECODE=1 then measures the trained model with benchmarks/bench_decode.py: KV eviction at
# evict_below -10 against a window of the same mean size at 2048 and 8192 (FPA and FoX only;
# eviction/decode_bench.{json,txt}) and decode ms/token at batch 1 at 1024-16384
# (decode/decode_bench.{json,txt}), each within its own time limit (EVICT_LIMIT, DECODE_LIMIT s).
# A 125M FPA run trains in about 310 s and evaluates in about 80 s (2026-12-03), so with DECODE
# set LIMIT=400 to keep the whole script within ten minutes; each step prints its rows as it goes.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
test -d data/prose || { echo "error: data/prose is missing (build it with benchmarks/prepare_prose_corpus.py)"; exit 2; }
out=$OUT/lm_compare_${MODEL:?set MODEL to one of fpa fox softmax_rope selective_rope gdn hybrid}
mkdir -p $out
timeout ${LIMIT:-570} python3 -m train.experiments.lm_compare --size h200 --models $MODEL --out $out \
    --runs-dir /tmp/runs --samples ${SAMPLES:-20} 2>&1 | tee $out/train_log.txt | grep -v "^step" | tail -40
if [ -n "$DECODE" ]; then
  case $MODEL in fpa|fox)
    timeout ${EVICT_LIMIT:-90} python3 benchmarks/bench_decode.py --models /tmp/runs/$MODEL \
        --contexts 2048 8192 --skip-decode --loss-batch ${LOSS_BATCH:-2} --out $out/eviction 2>&1 | tail -6 ;;
  esac
  timeout ${DECODE_LIMIT:-100} python3 benchmarks/bench_decode.py --models /tmp/runs/$MODEL \
      --contexts 1024 2048 4096 8192 16384 --skip-eviction --out $out/decode 2>&1 | tail -8
fi
