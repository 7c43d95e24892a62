"""Dense speculative verification is lossless: the emitted token is distributed as p.

Statistical test: for fixed seeds and several (p, q) pairs on a 6-token vocabulary, the
first emitted token over N = 40,000 draws has total-variation distance < 0.015 from p
(the TV of N multinomial draws from p itself is ~0.006 here, so 0.015 is a wide margin
that still catches a wrong residual, which is off by > 0.05 on these pairs).
"""

from __future__ import annotations

import numpy as np
import pytest

from acespec.shared.rejection import verify_greedy, verify_sampled
from acespec.shared.sampling import sample

N = 40_000
PAIRS = {
    "close": ([0.4, 0.3, 0.1, 0.1, 0.05, 0.05], [0.35, 0.35, 0.1, 0.1, 0.05, 0.05]),
    "disjoint": ([0.0, 0.0, 0.0, 0.5, 0.5, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]),
    "heavy_tail": ([0.05, 0.05, 0.1, 0.1, 0.2, 0.5], [0.9, 0.02, 0.02, 0.02, 0.02, 0.02]),
    "point_q": ([0.3, 0.2, 0.2, 0.1, 0.1, 0.1], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_first_token_distribution_equals_p(name):
    p, q = (np.array(x) for x in PAIRS[name])
    rng = np.random.default_rng(1234)
    counts = np.zeros(len(p))
    for _ in range(N):
        x = sample(q, rng)
        v = verify_sampled(np.stack([p, p]), q[None], np.array([x]), rng)
        counts[x if v.accepted else v.next_token] += 1
    tv = 0.5 * np.abs(counts / N - p).sum()
    assert tv < 0.015, f"{name}: TV {tv:.4f}"


def test_second_token_after_acceptance_is_bonus_from_p_next():
    p0, q0 = np.array([0.5, 0.5, 0, 0]), np.array([0.5, 0.5, 0, 0])  # always accepted
    p1 = np.array([0.1, 0.2, 0.3, 0.4])
    rng = np.random.default_rng(7)
    counts = np.zeros(4)
    for _ in range(N):
        v = verify_sampled(np.stack([p0, p1]), q0[None], np.array([sample(q0, rng)]), rng)
        assert v.accepted == 1
        counts[v.next_token] += 1
    assert 0.5 * np.abs(counts / N - p1).sum() < 0.015


def test_greedy_accepts_matching_prefix():
    v = verify_greedy(np.array([3, 5, 9, 2]), np.array([3, 5, 1]))
    assert (v.accepted, v.next_token, v.emitted) == (2, 9, 3)
    v = verify_greedy(np.array([3, 5, 9, 2]), np.array([3, 5, 9]))
    assert (v.accepted, v.next_token) == (3, 2)
