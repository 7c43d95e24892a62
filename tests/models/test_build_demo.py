"""The demo-pair builder end to end on the 'tiny' preset (seconds), and its outputs."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")

from acespec.models.build_demo import build_demo  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("build")
    card = build_demo(root / "out", root / "work", "tiny", seed=3)
    return root, card


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_outputs_and_card(built):
    root, card = built
    out = root / "out"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (out / "target" / name).is_file(), name
    assert (out / "drafter-f16.gguf").is_file() and (out / "drafter-q8_0.gguf").is_file()
    assert set(card["greedy_acceptance"]) == {"2", "4", "8"}
    assert all(1 <= v <= int(d) + 1 for d, v in card["greedy_acceptance"].items())
    assert json.loads((out / "build.json").read_text())["corpus"]["sha256"] == card["corpus"]["sha256"]
    assert "Greedy acceptance" in (out / "README.md").read_text()


def test_transformers_loads_target_unchanged_and_logits_match(built):
    from acespec.cloud.target.loader import load_model

    target = built[0] / "out" / "target"
    hf = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    ours = load_model(target)
    ids = list(range(2, 40))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (ours(ids, ours.new_cache()) - ref).abs().max().item() < 2e-4


def test_q8_gguf_tracks_f16(built):
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig

    out = built[0] / "out"
    ids = list(range(2, 60))
    cfg = LlamaDrafterConfig(n_ctx=128, n_seq_max=1)
    f16 = LlamaDrafter(out / "drafter-f16.gguf", cfg).logits(ids)
    q8 = LlamaDrafter(out / "drafter-q8_0.gguf", cfg).logits(ids)
    assert np.abs(f16 - q8).max() < 0.1  # Q8_0 error on O(1) logits


@pytest.mark.slow
def test_rebuild_is_deterministic_and_resumes(built, tmp_path):
    root, _ = built
    again = build_demo(tmp_path / "out", tmp_path / "work", "tiny", seed=3)
    assert _digest(tmp_path / "out/target/model.safetensors") == \
        _digest(root / "out/target/model.safetensors")
    assert _digest(tmp_path / "out/drafter-q8_0.gguf") == _digest(root / "out/drafter-q8_0.gguf")
    # A second call finds finished checkpoints and retrains nothing, with the same result.
    resumed = build_demo(tmp_path / "out", tmp_path / "work", "tiny", seed=3)
    assert resumed["valid_perplexity"] == again["valid_perplexity"]
