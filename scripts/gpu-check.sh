#!/usr/bin/env bash
# The GPU checks, as one short script to run on a CUDA machine:
# the kernels' GPU check, then the verifier's pass time vs nodes on a Llama-8B-shaped random
# model (TP=1, bf16). Results go to $OUT (or ./gpu-results): gpucheck.txt, profile-8b.json/.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
PY=${PYTHON:-python}
export PYTHONSAFEPATH=1  # run from the repository root: keep it off sys.path (docs/design.md §2)
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -m acespec.kernels.gpucheck 2>&1 | tee "$OUT/gpucheck.txt"
"$PY" -m acespec.cloud profile --random llama-8b --device cuda --dtype bfloat16 --tp 1 \
  --nodes 1,4,16,64,256 --context 1024 --repeats 20 --json > "$OUT/profile-8b.json" \
  2> "$OUT/profile-8b.log"
"$PY" -c "import json,sys; from acespec.cloud.target.profile import Row, markdown; \
print(markdown([Row(**r) for r in json.load(open(sys.argv[1]))]))" "$OUT/profile-8b.json" \
  | tee "$OUT/profile-8b.md"
