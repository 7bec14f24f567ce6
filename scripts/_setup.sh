# Sourced by demo.sh and test.sh: create .venv and install Conveyor with what the scripts need.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# One stamp per set of extras: the demo installs fewer than the tests, and a stamp that did not
# say which extras it stands for made `demo.sh` then `test.sh` skip the test extras.
EXTRAS="${CONVEYOR_EXTRAS:-dev}"
STAMP=".venv/.conveyor-installed-${EXTRAS//,/-}"
# The test tools are pinned (see scripts/dev-constraints.txt); Conveyor's own dependencies are not.
CONSTRAINTS=()
if [[ ",$EXTRAS," == *",dev,"* ]]; then
  CONSTRAINTS=(--constraint scripts/dev-constraints.txt)
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ scripts/dev-constraints.txt -nt "$STAMP" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet "${CONSTRAINTS[@]}" -e ".[${EXTRAS}]"
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
