# On an H200 (about eight minutes at most): the exports of FoX, softmax + RoPE, Gated
# DeltaNet and the GDN + softmax hybrid loaded into flash-linear-attention's
# AutoModelForCausalLM, logits against the JAX model in true float32 (2 layers at length 256,
# 12 layers at 4096), at both frameworks' default precision (TF32) and in bfloat16
# (benchmarks/verify_export_fla.py; its docstring says what each column is).
# Run from the repo root with the wheel folders .whl and .whlhf in place ($OUT: the output
# folder, /tmp/verify_export_out if unset):
#     bash benchmarks/gpu/verify_export.sh
# .whl holds fla (flash_linear_attention, fla_core 0.6.0); .whlhf transformers and the rest of
# its stack (.whlhf/README.txt). Extra arguments go to the script (e.g. --models fox,gdn,
# --sizes 2x256x2, --budget 300). Writes $OUT/verify_export.log, $OUT/verify_export_fla.md
# (the table, printed last) and $OUT/verify_export_fla.json (every number); copy the last two
# to benchmarks/results/ to commit them. Exit status: the script's (0: every check passed).
set -o pipefail
OUT=${OUT:-/tmp/verify_export_out}
mkdir -p "$OUT"
LOG=$OUT/verify_export.log
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 --version
} > "$LOG" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl .whlhf/*.whl >> "$LOG" 2>&1 \
    || { echo "verify_export.sh: installing .whl and .whlhf failed:"; tail -20 "$LOG"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 530 python3 benchmarks/verify_export_fla.py --out "$OUT" --budget 480 "$@" 2>&1 \
    | grep --line-buffered -v -E "Loading weights:|UserWarning: |warnings.warn\(" \
    | tee -a "$LOG"
