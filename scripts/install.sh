#!/usr/bin/env bash
# Install AceSpec with every extra into ./.venv (idempotent; quick when already done).
#
#   ACESPEC_VENV   where the virtual environment goes (default: .venv in the repo)
#   ACESPEC_TORCH  the torch requirement (default: torch==2.13.0, the CPU build on this
#                  testbed; a looser spec can pull a multi-GB CUDA build)
#   CMAKE_ARGS     llama.cpp build flags (default: scripts/llama-cmake-args.sh's for this
#                  platform: Metal on Apple Silicon, portable AVX2 on x86-64, plain elsewhere)
#   ACESPEC_CONSTRAINTS  pip constraints for everything else (default: constraints.txt, the
#                  versions CI checks; 'none': the newest releases pyproject.toml allows)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ACESPEC_VENV:-.venv}
PY=${PYTHON:-python3}
TORCH=${ACESPEC_TORCH:-torch==2.13.0}
LLAMA=llama-cpp-python==0.3.36
CONSTRAINTS=${ACESPEC_CONSTRAINTS:-constraints.txt}
CMAKE_ARGS=${CMAKE_ARGS:-$(bash scripts/llama-cmake-args.sh)}
export CMAKE_ARGS

say() { printf '\033[1m[install]\033[0m %s\n' "$*" >&2; }
# can_apt: whether Debian packages can be installed here (root, apt-get present).
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
# apt_install PKG...: Debian packages, updating the package index once if the first try fails.
apt_install() {
  apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 || \
    { apt-get update -q >/dev/null 2>&1 && \
      apt-get install -y -q --no-install-recommends "$@" >/dev/null; }
}

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
PINS=()
if [ "$CONSTRAINTS" != none ]; then
  [ -f "$CONSTRAINTS" ] || { say "no constraints file $CONSTRAINTS (ACESPEC_CONSTRAINTS=none: newest releases)"; exit 2; }
  PINS=(-c "$CONSTRAINTS")
fi
"${PIP[@]}" install -q --upgrade pip setuptools wheel
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  say "installing $TORCH"
  "${PIP[@]}" install -q "${PINS[@]}" "$TORCH"
fi
if ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  say "installing $LLAMA (compiles llama.cpp on first install: ~5-20 min; pip caches the wheel)"
  say "  CMAKE_ARGS=$CMAKE_ARGS"
  "${PIP[@]}" install -q "$LLAMA"
fi
# nginx: the load-balancer tests run real nginx (grpc_pass). Installed when we can.
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  if can_apt; then
    say "installing nginx-light (Debian package) for the load-balancer tests"
    apt_install nginx-light
  else
    say "nginx not found and cannot install it here: the load-balancer test will be skipped"
  fi
fi
# systemd-analyze: the start-at-login test checks the edge's systemd unit with it.
if ! command -v systemd-analyze >/dev/null && [ "$(uname -s)" = Linux ]; then
  if can_apt; then
    say "installing systemd (Debian package, for systemd-analyze) for the service-unit test"
    apt_install systemd
  else
    say "systemd-analyze not found and cannot install it here: the unit check will be skipped"
  fi
fi
# Prometheus: the dashboard and alert tests run Debian's prometheus and promtool. Its service
# is not started meanwhile (a policy-rc.d refuses it while apt installs, unless one exists).
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  if can_apt; then
    say "installing prometheus (Debian package) for the dashboard and alert tests"
    policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
      policy=1
    fi
    rc=0
    apt_install prometheus || rc=$?
    if [ -n "$policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
    [ "$rc" = 0 ] || exit "$rc"
  else
    say "prometheus not found and cannot install it here: the dashboard test will be skipped"
  fi
fi
# Chromium: the chat page's tests drive Debian's chromium headless through playwright (which
# downloads no browser of its own).
if ! command -v chromium >/dev/null; then
  if can_apt; then
    say "installing chromium (Debian package) for the chat page's browser tests"
    apt_install chromium
  else
    say "chromium not found and cannot install it here: the chat page's browser tests will be skipped"
  fi
fi
say "installing acespec[all] (editable; constraints: $CONSTRAINTS)"
"${PIP[@]}" install -q "${PINS[@]}" -e '.[all]'
# guidellm (tests/e2e/test_guidellm.py) pins an older click than ours: its own venv, which
# sees $VENV's packages through a .pth file and adds only what guidellm needs on top.
GL_VENV=${ACESPEC_GUIDELLM_VENV:-.venv-guidellm}
if [ "${ACESPEC_GUIDELLM:-}" != none ] && [ ! -x "$GL_VENV/bin/guidellm" ]; then
  say "installing guidellm into $GL_VENV (over $VENV's packages; constraints-guidellm.txt)"
  "$PY" -m venv "$GL_VENV"
  base=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  own=$("$GL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base" > "$own/acespec-venv.pth"
  GL_PINS=()
  [ "$CONSTRAINTS" != none ] && GL_PINS=(-c constraints-guidellm.txt)
  "$GL_VENV/bin/python" -m pip install -q --disable-pip-version-check "${GL_PINS[@]}" \
    guidellm==0.8.1 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$GL_VENV/bin/guidellm" --version >/dev/null
fi
say "ready: $VENV/bin/acespec"
