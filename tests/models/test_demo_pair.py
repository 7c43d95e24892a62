"""The committed demo pair (models/demo): loadable by transformers and by AceSpec with
matching logits; the Q8_0 drafter tracks the F16 one; sizes within budget; one vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")

from acespec.models import DEMO_DIR, DEMO_TARGET  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

TEXT = "def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n"


def test_demo_files_exist_within_size_budget():
    assert (DEMO_TARGET / "model.safetensors").stat().st_size <= 40 * 2**20
    for ft in ("f16", "q8_0"):
        assert (DEMO_DIR / f"drafter-{ft}.gguf").stat().st_size <= 8 * 2**20
    assert "Greedy acceptance" in (DEMO_DIR / "README.md").read_text()


def test_target_loads_in_transformers_with_matching_logits():
    from acespec.cloud.target.loader import load_model

    ids = Tokenizer.load(DEMO_TARGET).encode(TEXT)
    hf = transformers.AutoModelForCausalLM.from_pretrained(DEMO_TARGET).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = load_model(DEMO_TARGET)
    diff = (ours(ids, ours.new_cache()) - ref).abs().max().item()
    print(f"demo target vs transformers: max|diff| {diff:.2e}")
    assert diff < 1e-3  # fp32; logits of a trained model are O(10)


def test_q8_drafter_tracks_f16_and_shares_the_vocabulary():
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig

    tok = Tokenizer.load(DEMO_TARGET)
    ids = tok.encode(TEXT)
    cfg = LlamaDrafterConfig(n_ctx=256, n_seq_max=1)
    f16 = LlamaDrafter(DEMO_DIR / "drafter-f16.gguf", cfg)
    q8 = LlamaDrafter(DEMO_DIR / "drafter-q8_0.gguf", cfg)
    a, b = f16.logits(ids), q8.logits(ids)
    diff, agree = float(np.abs(a - b).max()), float((a.argmax(1) == b.argmax(1)).mean())
    print(f"demo drafter Q8_0 vs F16: max|diff| {diff:.3f}, top-1 agreement {agree:.3f}")
    assert diff < 0.5 and agree >= 0.9
    assert f16.vocab_hash() == q8.vocab_hash() == tok.vocab_hash()
