# On an H200 (700 s at most, the sum of its timeouts): `python -m train bench` of fpa_125m,
# fox_125m, softmax_rope_125m, gdn_125m and hybrid_125m at context 2048, batch 8 (5 steps after
# 1 warm-up step), then benchmarks/verify_export_fla.py with the wheels of .whl and .whlhf.
# Writes bench_<preset>.json, verify_export_fla.{md,json} and log.txt (the GPU's name and every
# command's output) to $OUT.
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
