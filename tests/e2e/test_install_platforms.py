"""scripts/install.sh builds llama.cpp with flags for the platform it runs on, chosen by
scripts/llama-cmake-args.sh: here run with each platform's `uname -s` / `uname -m` answers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
X86 = {"-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"}
TRIMMED = {"-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
           "-DGGML_NATIVE=OFF"}


def cmake_args(system: str, machine: str) -> set[str]:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "llama-cmake-args.sh")],
                       env={**os.environ, "ACESPEC_UNAME_S": system, "ACESPEC_UNAME_M": machine},
                       capture_output=True, text=True, timeout=30, check=True)
    return set(r.stdout.split())


@pytest.mark.parametrize("system,machine,wanted,unwanted", [
    ("Darwin", "arm64", {"-DGGML_METAL=ON"}, X86),                       # Apple Silicon
    ("Darwin", "x86_64", X86 | {"-DGGML_METAL=OFF"}, {"-DGGML_METAL=ON"}),  # Intel Mac
    ("Linux", "x86_64", X86, {"-DGGML_METAL=ON"}),
    ("Linux", "aarch64", set(), X86 | {"-DGGML_METAL=ON"}),               # Graviton, Pi
    ("Linux", "arm64", set(), X86 | {"-DGGML_METAL=ON"}),
])
def test_each_platform_gets_its_flags(system, machine, wanted, unwanted):
    args = cmake_args(system, machine)
    assert TRIMMED <= args and wanted <= args and not unwanted & args, sorted(args)


def test_install_takes_its_default_from_the_selection():
    text = (ROOT / "scripts" / "install.sh").read_text()
    assert "CMAKE_ARGS=${CMAKE_ARGS:-$(bash scripts/llama-cmake-args.sh)}" in text
    assert "GGML_AVX2" not in text  # no x86 flag of its own
