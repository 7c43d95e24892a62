#!/usr/bin/env bash
# Dependency drift: install the newest releases pyproject.toml allows (no constraints) into a
# venv of their own, run the test suite there, and say which versions differ from
# constraints.txt (what CI installs). Meant to run on a schedule (nightly, weekly), so a new
# upstream release is met here before a user's fresh install meets it.
#
#   bash scripts/drift-check.sh [--update] [pytest args...]
#
#   --update            rewrite constraints.txt from the newest versions if the suite passed
#   ACESPEC_DRIFT_VENV  the venv (default .venv-latest; rebuilt from scratch each run)
# Exit status: the test suite's (0: the newest releases work).
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [ "${1:-}" = --update ]; then update=1; shift; fi
VENV=${ACESPEC_DRIFT_VENV:-.venv-latest}
say() { printf '\033[1m[drift]\033[0m %s\n' "$*" >&2; }

rm -rf "$VENV"
ACESPEC_VENV=$VENV ACESPEC_CONSTRAINTS=none bash scripts/install.sh
fresh=$(mktemp)
"$VENV/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
  | grep -v -e '^torch==' -e '^llama_cpp_python==' -e '^acespec' | sort -f > "$fresh"
say "newer or other than constraints.txt:"
diff <(grep -v '^#' constraints.txt | sort -f) "$fresh" | grep '^[<>]' || say "(none)"

set +e
# The constraints test states CI's pins, which this venv ignores on purpose.
ACESPEC_VENV=$VENV ACESPEC_SKIP_INSTALL=1 bash scripts/test.sh \
  --deselect tests/test_constraints.py::test_installed_versions_are_the_constrained_ones "$@"
rc=$?
set -e
if [ $rc -eq 0 ] && [ $update -eq 1 ]; then
  { grep '^#' constraints.txt; cat "$fresh"; } > constraints.txt.new && mv constraints.txt.new constraints.txt
  say "constraints.txt updated to the newest releases (review and commit it)"
fi
rm -f "$fresh"
say "suite on the newest releases: $([ $rc -eq 0 ] && echo passed || echo "FAILED (rc $rc)")"
exit $rc
