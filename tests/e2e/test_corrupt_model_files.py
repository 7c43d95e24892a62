"""Corrupt model, drafter and tokenizer files given to the commands as a user runs them: each
is one error line on stderr that names the file and says what is wrong with it, and exit 2,
before anything is served. The files are corrupt copies of the tiny test pair: a config.json
that is a JSON array, safetensors cut to half and to 4 bytes, a garbage tokenizer.json, a
GGUF cut to half and an empty one."""

from __future__ import annotations

import os
import re
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from cli_harness import acespec  # noqa: E402
from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING) ")  # progress logging, not errors


@pytest.fixture(scope="module")
def corrupt(tiny_pair, tiny_hf_dir, tmp_path_factory):
    """name -> path: corrupt copies of the tiny target folder and of its q8_0 GGUF."""
    root = tmp_path_factory.mktemp("corrupt")

    def target_copy(name: str):
        return shutil.copytree(tiny_hf_dir, root / name)

    (target_copy("list-config") / "config.json").write_text("[1, 2, 3]\n")
    weights = target_copy("half-weights") / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    os.truncate(target_copy("four-byte-weights") / "model.safetensors", 4)
    (target_copy("garbage-tokenizer") / "tokenizer.json").write_text("{not json at all")
    gguf = tiny_pair[2]["q8_0"]
    short = root / "short.gguf"
    short.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    (root / "empty.gguf").write_bytes(b"")
    return {p.name: p for p in root.iterdir()}


def _one_error_line(proc, command: str, file, *words: str) -> str:
    """Exit 2, no traceback, and one stderr line besides progress logging: the command's
    error, naming `file` and saying each of `words`."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not LOG_LINE.match(ln)]
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith(f"acespec {command}: error: ") and str(file) in line, line
    assert all(w in line for w in words), line
    return line


CLOUD_MODEL = [  # (copy, file in it, words)
    ("list-config", "config.json", ["holds an array, not a JSON object"]),
    ("half-weights", "model.safetensors", ["truncated", "the tensors run past its end"]),
    ("four-byte-weights", "model.safetensors", ["truncated (4 bytes"]),
    ("garbage-tokenizer", "tokenizer.json", ["not a tokenizer.json"]),
]


@pytest.mark.parametrize("name, file, words", CLOUD_MODEL, ids=[c[0] for c in CLOUD_MODEL])
def test_cloud_serve_model(corrupt, name, file, words):
    p = acespec("cloud", "serve", "--host", "127.0.0.1", "--port", "0", "--model",
                str(corrupt[name]), timeout=120)
    _one_error_line(p, "cloud serve", corrupt[name] / file, *words)


GAP = [  # (corrupt file or folder, the file named, words)
    ("short.gguf", "", ["--gap-drafter", "truncated (", " bytes of "]),
    ("empty.gguf", "", ["--gap-drafter", "empty file, not a GGUF model"]),
    ("garbage-tokenizer", "tokenizer.json", ["--gap-drafter", "not a tokenizer.json"]),
    ("half-weights", "model.safetensors", ["--gap-drafter", "truncated"]),
]


@pytest.mark.parametrize("name, file, words", GAP, ids=[c[0] for c in GAP])
def test_cloud_serve_gap_drafter(corrupt, tiny_hf_dir, name, file, words):
    p = acespec("cloud", "serve", "--host", "127.0.0.1", "--port", "0", "--model",
                str(tiny_hf_dir), "--gap-drafter", str(corrupt[name]), timeout=120)
    _one_error_line(p, "cloud serve", corrupt[name] / file if file else corrupt[name], *words)


def test_cloud_loadtest_model(corrupt):
    p = acespec("cloud", "loadtest", "--model", str(corrupt["four-byte-weights"]), timeout=120)
    _one_error_line(p, "cloud loadtest", corrupt["four-byte-weights"] / "model.safetensors",
                    "truncated")


EDGE_DRAFTER = [
    ("short.gguf", ["--drafter", "llama.cpp could not load it", "not within the file bounds"]),
    ("empty.gguf", ["--drafter", "empty file, not a GGUF model"]),
]


@pytest.mark.parametrize("name, words", EDGE_DRAFTER, ids=[c[0] for c in EDGE_DRAFTER])
def test_edge_generate_drafter(corrupt, name, words):
    p = acespec("edge", "generate", "hello", "--cloud", "127.0.0.1:9", "--drafter",
                str(corrupt[name]), timeout=120)
    _one_error_line(p, "edge generate", corrupt[name], *words)


@pytest.mark.parametrize("name, words", EDGE_DRAFTER, ids=[c[0] for c in EDGE_DRAFTER])
def test_edge_serve_drafter(corrupt, name, words):
    p = acespec("edge", "serve", "--port", str(free_port()), "--cloud", "127.0.0.1:9",
                "--drafter", str(corrupt[name]), timeout=120)
    _one_error_line(p, "edge serve", corrupt[name], *words)


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_edge_ngram_tokenizer(corrupt, command):
    folder = corrupt["garbage-tokenizer"]
    args = ["hello"] if command == "generate" else ["--port", str(free_port())]
    p = acespec("edge", command, *args, "--cloud", "127.0.0.1:9", "--drafter", "ngram",
                "--tokenizer", str(folder), timeout=120)
    _one_error_line(p, f"edge {command}", folder / "tokenizer.json", "--tokenizer",
                    "not a tokenizer.json")


@pytest.mark.parametrize("flag, name, file", [("--model", "half-weights", "model.safetensors"),
                                              ("--drafter", "short.gguf", "")])
def test_local_generate(corrupt, tiny_hf_dir, tiny_pair, flag, name, file):
    """`acespec generate` (target and drafter in this process)."""
    files = {"--model": str(tiny_hf_dir), "--drafter": str(tiny_pair[2]["q8_0"]),
             flag: str(corrupt[name])}
    p = acespec("generate", "hello", "--max-tokens", "2", *[x for kv in files.items() for x in kv],
                timeout=120)
    _one_error_line(p, "generate", corrupt[name] / file if file else corrupt[name])


@pytest.mark.parametrize("flag, name, file", [("--model", "list-config", "config.json"),
                                              ("--drafter", "short.gguf", "")])
def test_demo_and_bench(corrupt, tiny_hf_dir, tiny_pair, flag, name, file):
    """`acespec demo` and `acespec bench` hand the files to children: they check them first."""
    files = {"--model": str(tiny_hf_dir), "--drafter": str(tiny_pair[2]["q8_0"]),
             flag: str(corrupt[name])}
    named = corrupt[name] / file if file else corrupt[name]
    for command in ("demo", "bench"):
        p = acespec(command, *[x for kv in files.items() for x in kv], timeout=120)
        _one_error_line(p, command, named)
