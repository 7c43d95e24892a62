"""Tiny positive temperatures (acespec.shared.sampling.tempered): every accepted temperature,
down to the smallest float64 5e-324, gives a distribution, never NaN or an error, and a tiny
one gives the greedy token: the drafter's q, the served p~, the coupled draw and the exact
rejection verdict alike. Logits are seeded float32 rows without ties."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.shared.config import SamplingParams
from acespec.shared.coupled import coupled_draft, coupled_target
from acespec.shared.rejection import verify_sampled
from acespec.shared.sampling import tempered, transform
from acespec.shared.served import UNITS, ServeParams, node_score, served

TINY = [5e-324, 1e-310, 1e-300, 1e-30]
SHAPES = [(0, 1.0), (20, 1.0), (0, 0.9), (5, 0.5)]  # (top_k, top_p)
pytestmark = pytest.mark.filterwarnings("error")  # no overflow/invalid RuntimeWarning either


def _logits(seed: int, n: int = 4, vocab: int = 300) -> np.ndarray:
    """[n, vocab] float32 logits, as a model returns them; seeded, no tied maxima."""
    rows = (np.random.default_rng(seed).normal(size=(n, vocab)) * 4).astype(np.float32)
    assert all((r == r.max()).sum() == 1 for r in rows)
    return rows


@pytest.mark.parametrize("temp", TINY)
@pytest.mark.parametrize("top_k,top_p", SHAPES)
def test_tiny_temperature_transform_is_the_greedy_one_hot(temp, top_k, top_p):
    logits = _logits(1)
    q = transform(logits, SamplingParams(temp, top_k, top_p))
    assert np.array_equal(q, transform(logits, SamplingParams(0.0)))


@pytest.mark.parametrize("temp", TINY)
@pytest.mark.parametrize("top_k,top_p", SHAPES)
def test_tiny_temperature_served_is_the_greedy_token(temp, top_k, top_p):
    params = ServeParams(SamplingParams(temp, top_k, top_p))
    for row in _logits(2):
        dist = served(row, params)
        assert dist.ids.tolist() == [int(row.argmax())] and dist.units.tolist() == [UNITS]
        score = node_score(dist, params, node_id=3, self_units=0, seed=7, position=5)
        assert score.ids.tolist() == [int(row.argmax())] and score.tail_units == 0


@pytest.mark.parametrize("temp", TINY)
def test_tiny_temperature_coupled_draw_and_verdict_are_greedy(temp):
    """Both sides of coupled sampling at many (seed, position): the argmax every time."""
    sampling = SamplingParams(temp, coupled=True)
    logits = _logits(3)
    q = transform(logits, sampling)
    for seed in range(5):
        for pos, row in enumerate(logits):
            dist = served(row, ServeParams(sampling))
            assert coupled_draft(q[pos], seed, pos) == int(row.argmax())
            assert coupled_target(dist.ids, dist.units, seed, pos) == int(row.argmax())


@pytest.mark.parametrize("temp", TINY)
def test_tiny_temperature_exact_rejection_accepts_the_argmax(temp):
    """Exact rejection sampling with q = p = the tiny-temperature one-hots accepts every
    argmax draft and ends on the greedy bonus token."""
    logits = _logits(4, n=5)
    p = transform(logits, SamplingParams(temp))
    draft = logits[:4].argmax(axis=1)
    verdict = verify_sampled(p, p[:4], draft, np.random.default_rng(0))
    assert verdict.accepted == 4 and verdict.next_token == int(logits[4].argmax())


def test_tiny_temperature_splits_exact_ties_evenly():
    """The limit of the softmax, not greedy's lowest-id rule: exactly tied maxima share."""
    q = transform(np.array([[1.0, 3.0, 3.0, 0.0]]), SamplingParams(5e-324))
    assert q.tolist() == [[0.0, 0.5, 0.5, 0.0]]


@pytest.mark.parametrize("temp", [1e-3, 0.3, 1.0, 2.0])
def test_ordinary_temperatures_are_the_plain_softmax(temp):
    """Shifting before dividing changes nothing but rounding at ordinary temperatures."""
    logits = _logits(5).astype(np.float64)
    z = logits / temp
    want = np.exp(z - z.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    assert np.allclose(transform(logits, SamplingParams(temp)), want, rtol=1e-12, atol=1e-300)
    assert (tempered(logits, temp) <= 0).all()


def test_top_k_and_top_p_rank_the_unshifted_logits():
    """Logits a hair apart (6.9e-112 vs 0.0) round together once shifted by the maximum; the
    cut still sees them apart, as the served p~ (ranked by raw logits) does."""
    logits = np.array([[0.0, 1.0, 6.941507652674707e-112]])
    q = transform(logits, SamplingParams(1.0, top_k=2))[0]
    assert q[0] == 0 and q[1] > q[2] > 0
    q = transform(logits, SamplingParams(1.0, top_p=0.75))[0]
    assert q[0] == 0 and q[1] > q[2] > 0
