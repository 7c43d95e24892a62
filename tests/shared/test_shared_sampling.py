"""The sampling transform, the n-gram drafter, and vocab identity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from acespec.edge.drafting.ngram import NgramDrafter
from acespec.shared.config import ConfigError, SamplingParams
from acespec.shared.sampling import sample, transform
from acespec.shared.tokenizer import vocab_hash

logit_rows = st.lists(st.floats(-20, 20), min_size=2, max_size=40)


@settings(max_examples=200, deadline=None)
@example(row=[-1.07e-128, 0.0], temp=1.0, k=0, p=0.5)  # equal probabilities, unequal logits
@given(logit_rows, st.floats(0.05, 3.0), st.integers(0, 50), st.floats(0.05, 1.0))
def test_transform_is_a_distribution_respecting_top_k_and_top_p(row, temp, k, p):
    logits = np.array([row])
    probs = transform(logits, SamplingParams(temperature=temp, top_k=k, top_p=p))[0]
    assert abs(probs.sum() - 1) < 1e-9 and (probs >= 0).all()
    if 0 < k < len(row):
        # Ties at the k-th value may keep more than k; nothing below it survives.
        kth = np.sort(logits[0])[-k]
        assert (probs[logits[0] < kth] == 0).all()
    assert probs[np.argmax(logits[0])] > 0  # the most likely token always survives


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = transform(np.log(np.array([[0.5, 0.3, 0.15, 0.05]])),
                      SamplingParams(temperature=1.0, top_p=0.75))[0]
    assert np.allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0, 0])


def test_greedy_is_one_hot_lowest_id_on_ties():
    probs = transform(np.array([[1.0, 3.0, 3.0, 0.0]]), SamplingParams())
    assert probs.tolist() == [[0, 1, 0, 0]]


def test_sample_matches_distribution():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(p, rng) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0 and np.abs(draws - p).max() < 0.015  # ~4 sigma at n=20000


def test_bad_sampling_params_name_the_field():
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ConfigError, match="top_k"):
        SamplingParams(top_k=-2)
    assert SamplingParams.from_name("chat").temperature == 0.8


def test_vocab_hash_is_order_and_boundary_sensitive():
    assert vocab_hash(["a", "b"]) != vocab_hash(["b", "a"])
    assert vocab_hash(["ab", "c"]) != vocab_hash(["a", "bc"])
    assert vocab_hash(["a", "b"]) == vocab_hash(["a", "b"]).lower()
    assert vocab_hash([]).startswith("v1:")


def test_ngram_drafter_continues_a_repeat():
    d = NgramDrafter(vocab_size=10)
    draft = d.draft([1, 2, 3, 4, 1, 2], 3, SamplingParams(), np.random.default_rng(0))
    assert draft.tokens.tolist() == [3, 4, 1]
    assert (draft.q.argmax(1) == draft.tokens).all() and np.allclose(draft.q.sum(1), 1)
    no_match = d.draft([7], 2, SamplingParams(), np.random.default_rng(0))
    assert no_match.tokens.tolist() == [7, 7]
