"""The shipped SmolLM2 drafter (models/smollm2/drafter-q8_0.gguf, picked by --pair smollm2):
llama.cpp loads it, it tokenizes exactly as the target's GGUF does (chat template included),
its card matches the file, and it agrees with the target more often than chance on an
evaluation-split chat answered by the target (a smoke check; the card has the figures)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from acespec import pairs  # noqa: E402

pytestmark = pytest.mark.slow
TEXTS = ["<|im_start|>user\nWrite a function that checks for primes.<|im_end|>\n",
         "Ünïcödé naïve café ß 😀👍🏽 数字 123456", "'s 're 'll don't\r\n\x00ctrl"]


@pytest.mark.slow
def test_shipped_drafter_is_the_targets_tokenizer_and_matches_its_card(smollm2_cache):
    from acespec.models.smollm2 import GGUF_NAME
    from acespec.models.smollm2.corpus import LlamaBatch

    path = pairs.distilled_drafter()
    assert path.is_file() and path.stat().st_size <= 60 * 2**20
    card = json.loads((path.parent / "build.json").read_text())
    assert card["files"]["q8_0"]["bytes"] == path.stat().st_size
    t = LlamaBatch(smollm2_cache / "smollm2" / GGUF_NAME, n_seq=1, n_ctx_seq=256)
    d = LlamaBatch(path, n_seq=1, n_ctx_seq=256)
    try:
        assert d.vocab_size == t.vocab_size and d.eos_id == t.eos_id
        assert d.chat_template() == t.chat_template()
        for text in TEXTS:
            for special in (True, False):
                assert d.tokenize(text, special) == t.tokenize(text, special), text
        ids = t.tokenize(pairs.render_chat(t.chat_template(), "Explain what a hash table is."))
        seq = list(ids)
        for _ in range(24):  # the target's greedy answer
            seq.append(int(np.argmax(t._prefill(0, seq)[-1])))
        dl = d._prefill(0, seq)[len(ids) - 1:-1].argmax(-1)
        agree = float(np.mean(dl == np.array(seq[len(ids):])))
        # 10 of these 24 (the card: 45.4 % teacher-forced over 40 evaluation chats); one
        # token's margin for another CPU's float sums. A wrong or broken drafter agrees ~never.
        assert agree >= 9 / 24, agree
    finally:
        t.close()
        d.close()
