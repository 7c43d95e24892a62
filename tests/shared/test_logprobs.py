"""The target's logprobs: log-softmax and the top alternatives against torch, ties and short
vocabularies, and their wire form."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.proto.codec import WireError, decode_logprobs, encode_logprobs
from acespec.shared.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, token_logprob

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("vocab,top_n", [(7, 0), (7, 3), (7, 7), (5, 20), (49152, 20)])
def test_logprob_and_top_match_torch(vocab, top_n):
    rng = np.random.default_rng(vocab + top_n)
    logits = (rng.standard_normal(vocab) * 4).astype(np.float32)
    want = torch.log_softmax(torch.from_numpy(logits).double(), -1).numpy()
    for token in (0, vocab - 1, int(logits.argmin())):
        e = token_logprob(logits, token, top_n)
        assert e.logprob == pytest.approx(want[token], abs=1e-9)
        n = min(top_n, vocab)
        assert list(e.top_ids) == list(np.argsort(-want, kind="stable")[:n])
        assert e.top_logprobs == pytest.approx(list(want[list(e.top_ids)]), abs=1e-9)


def test_ties_at_the_cut_take_the_lower_ids():
    logits = np.array([0.0, 2.0, 1.0, 2.0, 1.0, 1.0, -3.0], np.float32)
    assert token_logprob(logits, 6, 4).top_ids == (1, 3, 2, 4)


def test_top_n_out_of_range_is_refused():
    with pytest.raises(ValueError, match="top_n"):
        token_logprob(np.zeros(4), 0, MAX_TOP_LOGPROBS + 1)


def test_wire_round_trip_and_a_short_message():
    entries = [TokenLogprob(-0.5, (3, 1), (-0.25, -1.5)), TokenLogprob(-2.0, (1, 3), (-0.125, -3.0))]
    back = decode_logprobs(encode_logprobs(entries), 2)
    assert [(e.top_ids, e.logprob) for e in back] == [(e.top_ids, e.logprob) for e in entries]
    assert [e.top_logprobs for e in back] == [e.top_logprobs for e in entries]  # exact in float32
    assert decode_logprobs(encode_logprobs([]), 0) == []
    with pytest.raises(WireError, match="for 3 tokens"):
        decode_logprobs(encode_logprobs(entries), 3)
    msg = encode_logprobs(entries)
    del msg.top[-1]
    with pytest.raises(WireError):
        decode_logprobs(msg, 2)
