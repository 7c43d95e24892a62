"""Coupled sampling (acespec.shared.coupled): exactness, determinism, acceptance bounds.

Statistical tests use fixed seeds, so they are deterministic; each asserts a chi-square
p-value above ALPHA = 1e-3 (bins with expected count < 5 are pooled into one).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from acespec.shared.config import SamplingParams
from acespec.shared.coupled import (
    acceptance_rate,
    coupled_draft,
    coupled_target,
    gumbel,
    hash64,
    to_unit,
)
from acespec.shared.sampling import transform
from acespec.shared.served import (
    UNITS,
    ServedDist,
    ServeParams,
    coupled_verdict,
    quantize,
    served,
)

ALPHA = 1e-3
N = 20_000  # positions per distribution: one independent draw each
SEED = 20240613


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """counts [k] observed, probs [k] expected probabilities (sum 1) -> chi-square p-value."""
    expected = probs * counts.sum()
    small = expected < 5
    if small.sum() > 1:
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return float(chisquare(counts, expected).pvalue)


def _target_counts(dist: ServedDist, seed: int = SEED, n: int = N) -> np.ndarray:
    """[k] how often each support entry of p~ was decided over positions 0..n-1."""
    where = {int(t): j for j, t in enumerate(dist.ids)}
    counts = np.zeros(len(dist.ids), dtype=np.int64)
    for pos in range(n):
        counts[where[coupled_target(dist.ids, dist.units, seed, pos)]] += 1
    return counts


def _dist(ids: list[int] | np.ndarray, probs: np.ndarray) -> ServedDist:
    units = quantize(np.asarray(probs, dtype=np.float64))
    keep = units > 0
    return ServedDist(ids=np.asarray(ids, dtype=np.int64)[keep], units=units[keep])


def _logits(vocab: int, scale: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=vocab) * scale


def _dense(dist: ServedDist, vocab: int) -> np.ndarray:
    p = np.zeros(vocab)
    p[dist.ids] = dist.units / UNITS
    return p


# --- the hash and the noise -------------------------------------------------------------

_M64 = (1 << 64) - 1


def _ref_mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _ref_hash(seed: int, position: int, token: int) -> int:
    """The module docstring's recipe, in Python integers (what a port would follow)."""
    g = 0x9E3779B97F4A7C15
    a = _ref_mix((seed + g) & _M64)
    k = _ref_mix((a + ((position + 1) & _M64) * g) & _M64)
    return _ref_mix((k + (token + 1) * g) & _M64)


@pytest.mark.parametrize("seed,position", [(0, 0), (1, 0), (SEED, 7), (-1, 2**64 - 1),
                                           (2**63, 123456789), (2**70 + 5, 3)])
def test_hash_matches_documented_recipe(seed: int, position: int) -> None:
    ids = np.array([0, 1, 2, 151_935, 2**31 - 1, 2**62], dtype=np.int64)
    got = hash64(seed, position, ids)
    assert got.dtype == np.uint64
    assert [int(h) for h in got] == [_ref_hash(seed & _M64, position & _M64, int(t)) for t in ids]


def test_uniforms_strictly_inside_unit_interval() -> None:
    extremes = np.array([0, 1, 4095, 4096, 2**63, 2**64 - 4097, 2**64 - 4096, 2**64 - 1],
                        dtype=np.uint64)
    u = to_unit(extremes)
    assert u[0] == 2.0**-53 and u[-1] == 1 - 2.0**-53
    assert np.all(u > 0) and np.all(u < 1)
    assert np.all(np.isfinite(-np.log(-np.log(u))))
    # Random hashes too, and the Gumbel moments (mean = Euler's gamma, var = pi^2/6).
    g = gumbel(SEED, 0, np.arange(200_000))
    assert np.all(np.isfinite(g))
    assert abs(g.mean() - 0.5772157) < 0.01 and abs(g.var() - np.pi**2 / 6) < 0.03


def test_noise_on_a_subset_equals_the_full_vocabulary() -> None:
    vocab = 50_000
    full = gumbel(SEED, 41, np.arange(vocab))
    subset = np.array([49_999, 3, 17, 0, 12_345, 17])  # any order, repeats allowed
    assert np.array_equal(gumbel(SEED, 41, subset), full[subset])
    assert len(np.unique(hash64(SEED, 41, np.arange(vocab)))) == vocab  # a bijection of id
    assert not np.array_equal(gumbel(SEED, 42, subset), full[subset])
    assert not np.array_equal(gumbel(SEED + 1, 41, subset), full[subset])


# --- determinism and greedy ---------------------------------------------------------------

def test_same_seed_and_position_same_token() -> None:
    dist = served(_logits(500, 2.0, 1), ServeParams(SamplingParams(temperature=1.0)))
    q = transform(_logits(500, 2.0, 2)[None], SamplingParams(temperature=1.0))[0]
    ys = [coupled_target(dist.ids, dist.units, SEED, pos) for pos in range(200)]
    assert ys == [coupled_target(dist.ids, dist.units, SEED, pos) for pos in range(200)]
    # Order of the support does not matter.
    rev = slice(None, None, -1)
    assert ys == [coupled_target(dist.ids[rev], dist.units[rev], SEED, pos) for pos in range(200)]
    xs = [coupled_draft(q, SEED, pos) for pos in range(200)]
    assert ys[:5] == [coupled_target(dist.ids, dist.units, np.int64(SEED), np.int64(pos))
                      for pos in range(5)]  # numpy integers hash like Python ones
    assert xs == [coupled_draft(q, SEED, pos) for pos in range(200)]
    assert ys != [coupled_target(dist.ids, dist.units, SEED + 1, pos) for pos in range(200)]
    # y does not depend on the draft: the verdict's decided token is y whatever was drafted.
    for pos, (x, y) in enumerate(zip(xs, ys)):
        assert coupled_verdict(x, dist, SEED, pos) == (x == y, y)
        assert coupled_verdict(-1, dist, SEED, pos) == (False, y)


def test_greedy_is_the_argmax() -> None:
    logits = _logits(300, 1.0, 3)
    dist = served(logits, ServeParams(SamplingParams()))
    assert len(dist.ids) == 1
    for pos in range(20):
        assert coupled_target(dist.ids, dist.units, SEED, pos) == int(logits.argmax())
        assert coupled_draft(np.eye(300)[int(logits.argmax())], SEED, pos) == int(logits.argmax())


def test_draft_rejects_all_zero_q() -> None:
    with pytest.raises(ValueError):
        coupled_draft(np.zeros(10), SEED, 0)


# --- exactness: y ~ p~, x ~ q ------------------------------------------------------------

def _tail_dist() -> ServedDist:
    """One head token with 60% and 400 tail tokens of decaying small mass (units 12..195)."""
    tail = 0.4 * np.geomspace(1, 1 / 16, 400)
    tail *= 0.4 / tail.sum()
    ids = np.random.default_rng(4).permutation(100_000)[:401]
    return _dist(ids, np.append(0.6, tail))


DISTS = {
    "peaked": lambda: ServedDist(ids=np.array([17, 3, 999, 42]),
                                 units=np.array([60_000, 3_000, 2_000, 536])),
    "flat": lambda: _dist(np.arange(100, 150), np.full(50, 1 / 50)),
    "tail": _tail_dist,
    "top_k_top_p": lambda: served(_logits(1_000, 3.0, 5),
                                  ServeParams(SamplingParams(temperature=0.8, top_k=40,
                                                             top_p=0.95))),
    "top_p_hot": lambda: served(_logits(1_000, 3.0, 6),
                                ServeParams(SamplingParams(temperature=1.5, top_p=0.5))),
    "long_k": lambda: served(_logits(5_000, 1.0, 7),
                             ServeParams(SamplingParams(temperature=2.0), k_max=256)),
}


@pytest.mark.parametrize("name", sorted(DISTS))
def test_target_is_exactly_served_distribution(name: str) -> None:
    dist = DISTS[name]()
    assert int(dist.units.sum()) == UNITS
    counts = _target_counts(dist)
    assert _chi2_p(counts, dist.units / UNITS) > ALPHA


def test_chi_square_has_power() -> None:
    """The same draws are rejected against p~ with 3% of its mass moved (sanity of the test)."""
    dist = DISTS["peaked"]()
    wrong = dist.units / UNITS + np.array([-0.03, 0.03, 0, 0])
    assert _chi2_p(_target_counts(dist), wrong) < ALPHA


@pytest.mark.parametrize("q", [
    np.array([0.0, 0.5, 0.0, 0.2, 0.15, 0.1, 0.05, 0.0]),
    transform(_logits(60, 2.0, 8)[None], SamplingParams(temperature=0.7, top_k=20))[0],
    np.full(30, 1 / 30, dtype=np.float32),
], ids=["zeros", "top_k", "flat_f32"])
def test_draft_is_exactly_q(q: np.ndarray) -> None:
    counts = np.bincount([coupled_draft(q, SEED, pos) for pos in range(N)], minlength=len(q))
    assert counts[q == 0].sum() == 0
    probs = q[q > 0].astype(np.float64)
    assert _chi2_p(counts[q > 0], probs / probs.sum()) > ALPHA


# --- acceptance: P(x == y) vs the coupling bound 1 - TV -------------------------------------

def _pair(sigma: float, seed: int) -> tuple[ServedDist, np.ndarray]:
    """p~ from target logits, q from the same logits plus N(0, sigma) drafter error."""
    logits = _logits(40, 2.0, seed)
    dist = served(logits, ServeParams(SamplingParams(temperature=1.0, top_k=30)))
    noisy = logits + np.random.default_rng(seed + 1).normal(size=40) * sigma
    return dist, transform(noisy[None], SamplingParams(temperature=1.0))[0]


@pytest.mark.parametrize("sigma", [0.3, 1.0, 3.0])
def test_acceptance_within_coupling_bounds(sigma: float) -> None:
    dist, q = _pair(sigma, 9)
    p = _dense(dist, len(q))
    one_minus_tv = float(np.minimum(p, q).sum())
    tv = 1 - one_minus_tv
    exact = acceptance_rate(p, q)
    assert one_minus_tv / (1 + tv) - 1e-12 <= exact <= one_minus_tv + 1e-12
    n = 4_000
    hits = sum(coupled_draft(q, SEED, pos) == coupled_target(dist.ids, dist.units, SEED, pos)
               for pos in range(n))
    tol = 4 * np.sqrt(exact * (1 - exact) / n)  # 4 standard errors of the Monte Carlo mean
    assert abs(hits / n - exact) <= tol
    assert hits / n <= one_minus_tv + tol


def test_identical_distributions_always_accept() -> None:
    dist = DISTS["top_k_top_p"]()
    p = _dense(dist, 1_000)
    assert acceptance_rate(p, p) == pytest.approx(1.0, abs=1e-12)
    for pos in range(500):
        x = coupled_draft(p, SEED, pos)
        assert coupled_verdict(x, dist, SEED, pos) == (True, x)


def test_acceptance_rate_disjoint_is_zero() -> None:
    assert acceptance_rate(np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.3, 0.7])) == 0.0
