"""`acespec models export-gguf` from the shell: a target checkpoint written as a GGUF drafter
drafts, through llama.cpp, what the target decides; a folder that is no checkpoint, or an
output folder that does not exist, is refused with a message naming it."""

from __future__ import annotations

import numpy as np
import pytest

from cli_harness import acespec
from conftest import plain_greedy

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

TOKENS = 24


def test_the_exported_target_drafts_what_the_target_decides(tiny_pair, tiny_hf_dir, tmp_path):
    _, model, _ = tiny_pair
    out = tmp_path / "target-f32.gguf"
    r = acespec("models", "export-gguf", str(tiny_hf_dir), "--out", str(out), "--ftype", "f32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"wrote {out}" in r.stdout and out.stat().st_size > 0, r.stdout
    prompt = Tokenizer.load(tiny_hf_dir).encode("def parse(text):\n    ")
    drafter = LlamaDrafter(str(out), LlamaDrafterConfig(n_ctx=256, n_seq_max=1))
    try:
        draft = drafter.draft(prompt, TOKENS, SamplingParams(), np.random.default_rng(0))
    finally:
        drafter.close()
    expected = plain_greedy(model, prompt, TOKENS)
    same = sum(int(a) == b for a, b in zip(draft.tokens.tolist(), expected))
    # float32 both sides: only a near-tie rounded differently could part them
    assert same >= TOKENS - 2, (draft.tokens.tolist(), expected)


def test_what_is_not_a_checkpoint_is_refused_by_name(tiny_hf_dir, tmp_path):
    r = acespec("models", "export-gguf", str(tmp_path), "--out", str(tmp_path / "x.gguf"))
    assert r.returncode == 1 and f"{tmp_path}: no config.json" in r.stderr, r.stderr
    missing = tmp_path / "no-such-folder"
    r = acespec("models", "export-gguf", str(tiny_hf_dir), "--out", str(missing / "x.gguf"))
    assert r.returncode == 1 and f"{missing}: no such folder" in r.stderr, r.stderr
    assert not missing.exists()

