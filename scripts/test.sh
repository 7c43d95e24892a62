#!/usr/bin/env bash
# Install everything, then lint and run the whole test suite. Fails on any error.
#
#   bash scripts/test.sh [--fast] [pytest args...]
#
#   --fast   the quick lane for an edit-test loop (about 4 minutes on two cores): every test
#            not marked `slow` (servers started from the shell, model builds, long
#            statistical runs). CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=()
if [ "${1:-}" = --fast ]; then
  shift
  lane=(-m "not slow")
fi
[ "${ACESPEC_SKIP_INSTALL:-0}" = 1 ] || bash scripts/install.sh
VENV=${ACESPEC_VENV:-.venv}
# The repository root must never come before site-packages on sys.path: its folders (kernels/,
# models/, ...) would shadow installed packages of the same names (docs/design.md §2). The
# pytest executable does not add the working directory; PYTHONSAFEPATH keeps the `python -m`
# children the tests start from here off it too.
export PYTHONSAFEPATH=1
echo "[test] generated protobuf code up to date" >&2
PYTHON="$VENV/bin/python" bash scripts/gen_proto.sh --check
echo "[test] ruff" >&2
"$VENV/bin/ruff" check .
echo "[test] pytest" >&2
"$VENV/bin/pytest" -q --durations=15 ${lane[@]+"${lane[@]}"} "$@"
