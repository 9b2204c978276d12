# One H200 call: per-kernel device time of the FPA, FoX and GDN kernels' forward+backward
# (benchmarks/op_trace.py) and where the 125M train step's compile time goes
# (benchmarks/compile_profile.py, 2-layer models). Run from the repo root with the wheels of
# grain, array_record and tensorboardX in .whl/; writes its tables and JSON to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total --format=csv
trace() { timeout 120 python3 benchmarks/op_trace.py "$@" --out $OUT 2>&1 | grep -v Warning | tail -22; }
{
trace fpa --shape 4,4096,12,64 --fields walk
trace fpa --shape 4,4096,12,64 --fields flat
trace fpa --shape 4,4096,12,64 --fields fox
trace fox --shape 4,4096,12,64
trace softmax --shape 4,4096,12,64
trace fpa --shape 1,16384,12,64 --fields flat
trace fpa --shape 8,2048,16,128 --fields walk
trace fox --shape 8,2048,16,128
trace gdn --shape 4,4096,16,128
} | tee $OUT/op_traces.txt
timeout 200 python3 benchmarks/compile_profile.py fpa_125m softmax_rope_125m fox_125m --layers 2 --cprofile fpa_125m --out $OUT 2>&1 | grep -v Warning | tail -8
