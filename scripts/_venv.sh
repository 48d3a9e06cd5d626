# Sourced by the scripts/ commands: creates (or reuses) .venv with the package
# installed in editable mode with its tensorflow, tf-keras and test extras (one environment
# for the demo, the tests and the benchmark).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Re-install only when setup.py changed.
STAMP=".venv/.tf_lossscale-$("$PY" -c 'import hashlib,sys; print(hashlib.sha1(open(sys.argv[1],"rb").read()).hexdigest()[:12])' setup.py)"
if [ ! -f "$STAMP" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[tensorflow,tf-keras,test]"
  touch "$STAMP"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
