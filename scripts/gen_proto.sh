#!/usr/bin/env bash
# Regenerate proto/acespec_pb2.py, acespec_pb2_grpc.py and acespec_pb2.pyi from
# proto/acespec.proto. With --check, fail if the committed files are stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-${ACESPEC_VENV:-.venv}/bin/python}
# Absolute, but without resolving the venv's symlink (that would leave the venv).
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Generate as package acespec.proto so imports inside the stubs resolve when installed.
mkdir -p "$out/src/acespec/proto"
cp proto/acespec.proto "$out/src/acespec/proto/"
(cd "$out/src" && "$PY" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" acespec/proto/acespec.proto)
for f in acespec_pb2.py acespec_pb2_grpc.py acespec_pb2.pyi; do
  if [ "${1:-}" = "--check" ]; then
    if ! cmp -s "$out/acespec/proto/$f" "proto/$f"; then
      echo "proto/$f is stale: run scripts/gen_proto.sh and commit the result" >&2
      exit 1
    fi
  else
    cp "$out/acespec/proto/$f" "proto/$f"
  fi
done
[ "${1:-}" = "--check" ] && echo "generated protobuf code is up to date" >&2 || echo "regenerated proto/*_pb2*" >&2
