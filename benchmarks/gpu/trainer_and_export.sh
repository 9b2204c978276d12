set -x
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv >> $L
for p in fpa_125m fox_125m softmax_rope_125m gdn_125m hybrid_125m; do
  timeout 110 python -m train bench $p --context 2048 --batch-size 8 --steps 5 --warmup 1 --out $OUT/bench_$p.json >> $L 2>&1 || echo "bench $p failed rc=$?" >> $L
done
timeout 150 python benchmarks/verify_export_fla.py --out $OUT --wheels .whl,.whlhf >> $L 2>&1 || echo "verify rc=$?" >> $L
tail -c 6000 $L
