"""The SmolLM2 drafter build on the tiny preset, end to end, with the real target GGUF as the
teacher (a few chats of 8 tokens): the GGUF it writes loads in llama.cpp, tokenizes exactly
as the target does (chat template included), and the card reports acceptance."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.slow
TEXTS = ["<|im_start|>user\nWrite a function that checks for primes.<|im_end|>\n",
         "def f(x):\n\treturn x**2  # ok\n", "Ünïcödé naïve café ß 😀👍🏽 数字 123456",
         "  leading spaces and trailing  ", "'s 're 'll don't\r\n\x00ctrl"]


@pytest.fixture(scope="module")
def built(smollm2_cache, tmp_path_factory):
    from acespec.models.smollm2 import GGUF_NAME
    from acespec.models.smollm2_drafter import build

    target = smollm2_cache / "smollm2" / GGUF_NAME
    out = tmp_path_factory.mktemp("smollm2-drafter")
    card = build(target, out / "out", out / "work", "tiny", seed=0)
    return target, out, card


def _model(path):
    from acespec.models.smollm2_corpus import LlamaBatch

    return LlamaBatch(path, n_seq=1, n_ctx_seq=256)


def test_gguf_loads_and_tokenizes_like_the_target(built):
    target, out, _ = built
    t, d = _model(target), _model(out / "out" / "drafter-q8_0.gguf")
    assert d.vocab_size == t.vocab_size == 49152 and d.eos_id == t.eos_id
    assert d.chat_template() == t.chat_template()
    for text in TEXTS:
        for special in (True, False):
            assert d.tokenize(text, special) == t.tokenize(text, special), text
    ids, p = d.topk(t.tokenize(TEXTS[0]), 4)  # runs: logits for every position
    assert ids.shape == (len(t.tokenize(TEXTS[0])), 4) and np.isfinite(p.astype(float)).all()


def test_card_and_files(built):
    _, out, card = built
    saved = json.loads((out / "out" / "build.json").read_text())
    assert saved["greedy_acceptance"] == card["greedy_acceptance"]
    for kind in ("chat", "code"):
        assert 1.0 <= card["greedy_acceptance"][kind]["2"] <= 3.0
    assert {f["name"] for f in card["files"].values()} == {"drafter-f16.gguf", "drafter-q8_0.gguf"}
    assert "Greedy acceptance" in (out / "out" / "README.md").read_text()


def test_resume_skips_finished_stages(built):
    """A second build reuses the corpus, the checkpoint and gives the same acceptance."""
    from acespec.models.smollm2_drafter import build

    target, out, card = built
    again = build(target, out / "out", out / "work", "tiny", seed=0)
    assert again["greedy_acceptance"] == card["greedy_acceptance"]
    assert again["corpus"] == card["corpus"]
