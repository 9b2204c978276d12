#!/usr/bin/env bash
# Set up a virtual environment with the pinned dependencies, then run a job in it.
#   ./dev.sh main      set up, then run the main job (the embedded default)
#   ./dev.sh test      set up, then run the test suite
#   ./dev.sh setup     set up only
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}

find_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.13 python3.12 python3 \
      "$HOME"/.pyenv/versions/3.13*/bin/python "$HOME"/.pyenv/versions/3.12*/bin/python \
      /root/.pyenv/versions/3.13*/bin/python /root/.pyenv/versions/3.12*/bin/python; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
    if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: need Python >= 3.12 (set PYTHON=/path/to/python3.12)" >&2
  return 1
}

setup() {
  if [ ! -f "$VENV/.installed" ] || [ setup.cfg -nt "$VENV/.installed" ] || [ constraints.txt -nt "$VENV/.installed" ]; then
    local py; py=$(find_python)
    [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[test]"
    touch "$VENV/.installed"
  fi
}

job=${1:-main}; shift || true
setup
case "$job" in
  setup) ;;
  main) exec "$VENV/bin/python" -m train main "$@" ;;
  test) exec "$VENV/bin/python" -m pytest -n 2 -q "$@" ;;
  *) exec "$VENV/bin/python" -m train "$job" "$@" ;;
esac
