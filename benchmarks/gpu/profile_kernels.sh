# On an H200: per-kernel device time of the FPA, FoX and softmax kernels' forward+backward
# (benchmarks/op_trace.py) in FPA's three field regimes, and where the 125M train step's
# compile time goes (benchmarks/compile_profile.py, 2-layer models). Run from the repo root with
# the wheels of grain, array_record, portpicker and tensorboardX in .whl/; writes to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p /tmp/traces
SHAPES="4,4096,12,64 1,16384,12,64 8,2048,16,128"
{
timeout 300 python3 benchmarks/op_trace.py fpa --shape $SHAPES --fields walk,flat,fox --top 6 --out /tmp/traces
timeout 120 python3 benchmarks/op_trace.py fox --shape $SHAPES --top 6 --out /tmp/traces
timeout 120 python3 benchmarks/op_trace.py softmax --shape $SHAPES --top 6 --out /tmp/traces
timeout 120 python3 benchmarks/op_trace.py gdn --shape 4,4096,16,128 1,16384,16,128 8,2048,12,64 --top 12 --out /tmp/traces
} 2>&1 | grep -v Warning | tee $OUT/op_traces.txt
timeout 300 python3 benchmarks/compile_profile.py fpa_125m softmax_rope_125m fox_125m --layers 2 --cprofile fpa_125m --out $OUT 2>&1 | grep -v Warning | tail -8
tar czf $OUT/op_traces_json.tgz -C /tmp traces
