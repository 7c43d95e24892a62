#!/usr/bin/env bash
# Install everything, then lint and run the whole test suite. Fails on any error.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV=${ACESPEC_VENV:-.venv}
echo "[test] generated protobuf code up to date" >&2
PYTHON="$VENV/bin/python" bash scripts/gen_proto.sh --check
echo "[test] ruff" >&2
"$VENV/bin/ruff" check .
echo "[test] pytest" >&2
"$VENV/bin/python" -m pytest -q "$@"
