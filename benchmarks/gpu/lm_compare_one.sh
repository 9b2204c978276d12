# One H200 call per model (eight to nine minutes): train one `lm_compare --size h200` model
# (the paper's shape on the English prose corpus, configs/base/lmc_h200.yaml) and evaluate it
# in the same call: checkpoints cannot leave the machine, the tables can.
#   MODEL=fpa bash benchmarks/gpu/lm_compare_one.sh     carry: [".whl", "data/prose"]
# writes $OUT/lm_compare_<model>/lm_compare.{json,md,png} and train_log.txt; afterwards
#   python -m train.experiments.lm_compare --merge results/lm_compare_h200/*/lm_compare.json --out DIR
# builds the comparison (with FoX's run among them).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
test -d data/prose || { echo "error: data/prose is missing (carry it: benchmarks/prepare_prose_corpus.py)"; exit 2; }
out=$OUT/lm_compare_${MODEL:?set MODEL to one of fpa fox softmax_rope selective_rope gdn hybrid}
mkdir -p $out
timeout ${LIMIT:-570} python3 -m train.experiments.lm_compare --size h200 --models $MODEL --out $out \
    --runs-dir /tmp/runs --samples ${SAMPLES:-20} 2>&1 | tee $out/train_log.txt | grep -v "^step" | tail -40
