"""In-process speculative decoding with the real llama.cpp drafter and torch target."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import plain_greedy

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig  # noqa: E402
from acespec.edge.drafting.ngram import NgramDrafter  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402
from acespec.sim.local import generate_local  # noqa: E402


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_greedy_equals_plain_decoding(tiny_pair, depth):
    tok_dir, model, ggufs = tiny_pair
    prompt = Tokenizer.load(tok_dir).encode("import os\nimport sys\n")
    drafter = LlamaDrafter(ggufs["q8_0"], LlamaDrafterConfig(n_ctx=256, n_seq_max=1))
    out, stats = generate_local(model, drafter, prompt, 24, depth, SamplingParams())
    assert out == plain_greedy(model, prompt, 24)
    assert stats.steps >= 24 / (depth + 1) and 1 <= stats.mean_acceptance_length <= depth + 1
    assert stats.passes == stats.steps + 1


def test_ngram_drafter_greedy_equals_plain(tiny_pair):
    tok_dir, model, _ = tiny_pair
    prompt = Tokenizer.load(tok_dir).encode("a = 1\nb = 2\na = 1\n")
    out, _ = generate_local(model, NgramDrafter(model.args.vocab_size), prompt, 16, 4,
                            SamplingParams())
    assert out == plain_greedy(model, prompt, 16)


def test_sampled_generation_reproducible_per_seed(tiny_pair):
    tok_dir, model, ggufs = tiny_pair
    prompt = Tokenizer.load(tok_dir).encode("class A:\n")
    s = SamplingParams(temperature=1.0, top_k=50)
    runs = []
    for seed in (5, 5, 6):
        drafter = LlamaDrafter(ggufs["q8_0"], LlamaDrafterConfig(n_ctx=256, n_seq_max=1))
        runs.append(generate_local(model, drafter, prompt, 20, 4, s, seed=seed)[0])
    assert runs[0] == runs[1] and runs[0] != runs[2]


@pytest.mark.slow
def test_sampled_first_token_matches_target_distribution(tiny_pair):
    """Over 1,500 seeds the first generated token follows the target's p (TV < 0.08; the TV
    of 1,500 draws from p itself is ~0.04 for this support size)."""
    tok_dir, model, ggufs = tiny_pair
    prompt = Tokenizer.load(tok_dir).encode("def f(")
    s = SamplingParams(temperature=1.0, top_k=8)
    from acespec.shared.sampling import transform

    p = transform(model(prompt, model.new_cache(), last_only=True).numpy(), s)[0]
    drafter = LlamaDrafter(ggufs["q8_0"], LlamaDrafterConfig(n_ctx=256, n_seq_max=1))
    counts = np.zeros(len(p))
    n = 1500
    for seed in range(n):
        out, _ = generate_local(model, drafter, prompt, 1, 2, s, seed=seed)
        counts[out[0]] += 1
    tv = 0.5 * np.abs(counts / n - p).sum()
    assert tv < 0.08, tv


@pytest.mark.slow
def test_cli_generate_json(tiny_pair, tiny_hf_dir):
    tok_dir, _, ggufs = tiny_pair
    target_dir = tiny_hf_dir
    cmd = [sys.executable, "-m", "acespec", "generate", "for i in range(3):", "--model",
           str(target_dir), "--drafter", str(ggufs["q8_0"]), "--max-tokens", "12", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["token_ids"]) == 12 and out["stats"]["tokens"] >= 12
    assert out["stats"]["mean_acceptance_length"] >= 1
    bad = subprocess.run(cmd[:6] + [str(tok_dir / "nowhere")], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "no target checkpoint" in bad.stderr
    assert "Traceback" not in bad.stderr
