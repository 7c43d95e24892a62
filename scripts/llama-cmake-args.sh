#!/usr/bin/env bash
# Print the CMAKE_ARGS that build llama.cpp (llama-cpp-python) for this platform:
#
#   Darwin arm64 (Apple Silicon)  Metal (the GPU); ARM's NEON is built in on every arm64
#   x86_64 (Linux, Intel Mac)     the portable x86 set: AVX2, FMA, F16C (any x86-64 since 2013)
#   other (arm64 Linux, ...)      nothing CPU-specific: the compiler's defaults for the target
#
# Every platform: no tools, examples, tests, server or multimodal library (about 140 units
# instead of ~200), no OpenMP, no -march=native (the wheel runs on other machines).
#   CMAKE_ARGS="$(bash scripts/llama-cmake-args.sh)" pip install '.[edge]'
#
#   ACESPEC_UNAME_S, ACESPEC_UNAME_M  stand in for `uname -s` and `uname -m` (a test runs each
#                                     platform's answers through here)
set -euo pipefail
os=${ACESPEC_UNAME_S:-$(uname -s)}
arch=${ACESPEC_UNAME_M:-$(uname -m)}
args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF"
case "$os/$arch" in
  Darwin/arm64) args="$args -DGGML_METAL=ON" ;;
  Darwin/x86_64) args="$args -DGGML_METAL=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" ;;
  */x86_64|*/amd64) args="$args -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" ;;
esac
echo "$args"
