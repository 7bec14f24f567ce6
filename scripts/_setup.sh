# Sourced by demo.sh and test.sh: create .venv and install Conveyor with what the scripts need.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.conveyor-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[${CONVEYOR_EXTRAS:-dev}]"
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
