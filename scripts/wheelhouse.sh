#!/usr/bin/env bash
# Build the wheelhouse the Docker images install from (build/wheelhouse): every dependency of
# acespec[all] as a wheel, with the pinned CPU torch and the compiled llama-cpp-python, so that
# an image build installs with `pip install --no-index --find-links` (no registry, no compile
# inside a container), at the versions constraints.txt names. Idempotent: skipped while
# pyproject.toml, constraints.txt and the pins are unchanged.
#
#   ACESPEC_TORCH   the torch requirement (default torch==2.13.0, the CPU build; a looser
#                   spec can pull a multi-GB CUDA build)
#   WHEELHOUSE      where the wheels go (default build/wheelhouse)
#   PYTHON          the Python whose version the images run (default python3; 3.11 for the
#                   default bases python:3.11 and Debian bookworm)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${ACESPEC_TORCH:-torch==2.13.0}
LLAMA=llama-cpp-python==0.3.36
OUT=${WHEELHOUSE:-build/wheelhouse}
# The same flags as scripts/install.sh: pip reuses the wheel it cached from that compile.
export CMAKE_ARGS=${CMAKE_ARGS:-"-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"}

say() { printf '\033[1m[wheelhouse]\033[0m %s\n' "$*" >&2; }

stamp="$("$PY" -c 'import sys; print(sys.version_info[:2])') $TORCH $LLAMA $(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ -f "$OUT/.stamp" ] && [ "$(cat "$OUT/.stamp")" = "$stamp" ]; then
  say "up to date: $OUT ($(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1))"
  exit 0
fi
mkdir -p "$OUT"
say "building wheels into $OUT ($TORCH, $LLAMA, acespec[all] dependencies)"
"$PY" -m pip wheel -q --disable-pip-version-check -w "$OUT" -c constraints.txt \
  pip setuptools wheel "$TORCH" "$LLAMA" '.[all]' 2>&1 | { grep -v '^WARNING: Location' || true; } >&2
rm -f "$OUT"/acespec-*.whl   # the images install acespec from the source tree
echo "$stamp" > "$OUT/.stamp"
say "done: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
