# Sourced by scripts/demo and scripts/test: creates (or reuses) .venv with the
# package installed in editable mode plus the extras given in $EXTRAS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Re-install only when setup.py or the requested extras changed.
STAMP=".venv/.tf_lossscale-${EXTRAS//,/-}-$(sha1sum setup.py | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
  touch "$STAMP"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
