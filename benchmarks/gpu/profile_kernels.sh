# One H200 call: per-kernel device time of the FPA, FoX and softmax kernels' forward+backward
# (benchmarks/op_trace.py) in FPA's three field regimes, and where the 125M train step's
# compile time goes (benchmarks/compile_profile.py, 2-layer models). Run from the repo root with
# the wheels of grain, array_record, portpicker and tensorboardX in .whl/; writes to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total --format=csv
trace() { timeout 120 python3 benchmarks/op_trace.py "$@" --top 6 --out /tmp/traces 2>&1 | grep -v Warning | tail -8; }
mkdir -p /tmp/traces
{
for shape in 4,4096,12,64 1,16384,12,64 8,2048,16,128; do
  for fields in walk flat fox; do trace fpa --shape $shape --fields $fields; done
  trace fox --shape $shape
  trace softmax --shape $shape
done
} 2>&1 | tee $OUT/op_traces.txt
timeout 300 python3 benchmarks/compile_profile.py fpa_125m softmax_rope_125m fox_125m --layers 2 --cprofile fpa_125m --out $OUT 2>&1 | grep -v Warning | tail -8
tar czf $OUT/op_traces_json.tgz -C /tmp traces
