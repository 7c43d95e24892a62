"""Coupled sampling (docs/design.md §5): each position's token is a deterministic function of
(seed, position, distribution), by Gumbel-max with noise both sides compute identically.

The target's token is y = argmax_i log p~(i) + G(seed, position, i) over p~'s support; the
drafter's draft is x = argmax_i log q(i) + G(seed, position, i); a draft is accepted iff
x == y. y ~ p~ exactly, and for a seed y does not depend on the drafter. The acceptance
rate lies in [(1 - TV)/(1 + TV), 1 - TV] (`acceptance_rate` gives it exactly).

The noise G, exactly (uint64 arithmetic mod 2^64; a port must match it bit for bit):

    GAMMA  = 0x9E3779B97F4A7C15
    mix(z) = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
             z ^= z >> 31                        (the SplitMix64 output function)
    a = mix(seed + GAMMA)                        seed, position taken mod 2^64
    k = mix(a + (position + 1) * GAMMA)
    h = mix(k + (id + 1) * GAMMA)                id >= 0
    u = ((h >> 12) + 0.5) * 2^-52                float64, exact, in [2^-53, 1 - 2^-53]
    G = -log(-log(u))                            float64, in about [-3.604, 36.737]

That is: a is the first SplitMix64 output of state `seed`, k the (position+1)-th output of
state a, h the (id+1)-th output of state k. For a fixed (seed, position) h is a bijection of
id, so no two ids of one position share a noise value. Only the last ulp of `log` may differ
between libm's, which can flip a verdict only on a near-exact tie of scores.
"""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 output function on a uint64 array (numpy array arithmetic wraps)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hash64(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """h(seed, position, id) for ids [n] int (>= 0) -> [n] uint64 (see the module doc)."""
    sp = np.array([int(seed) & _MASK, int(position) & _MASK], dtype=np.uint64)
    a = _mix(sp[:1] + _GAMMA)
    k = _mix(a + (sp[1:] + _ONE) * _GAMMA)
    return _mix(k + (np.asarray(ids).astype(np.uint64) + _ONE) * _GAMMA)


def to_unit(h: np.ndarray) -> np.ndarray:
    """[n] uint64 -> [n] float64 uniforms in [2^-53, 1 - 2^-53]: never 0, never 1.
    The top 52 bits plus a half: (h >> 12) + 0.5 needs 53 significant bits, so it is exact."""
    return ((h >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52


def gumbel(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """Gumbel(0, 1) noise G(seed, position, id) for ids [n] int (>= 0) -> [n] float64.
    Each value depends only on its own (seed, position, id), so any subset of ids agrees
    with the full vocabulary at the ids it shares."""
    return -np.log(-np.log(to_unit(hash64(seed, position, ids))))


def _argmax_lowest_id(score: np.ndarray, ids: np.ndarray) -> int:
    """The id with the largest score [k], ties to the lowest id."""
    return int(ids[score == score.max()].min())


def coupled_target(dist_ids: np.ndarray, dist_units: np.ndarray, seed: int,
                   position: int) -> int:
    """The target's token y at `position` (the index of the token being decided).

    dist_ids: [k] int64 p~'s support, any order; dist_units: [k] int64 p~ in units of
    2^-16, all > 0. y = argmax log p~ + G over the support (the 2^-16 scale shifts every
    score alike and is left out); ties go to the lowest id. One entry (greedy) is that id.
    """
    ids = np.asarray(dist_ids, dtype=np.int64)
    if len(ids) == 1:
        return int(ids[0])
    score = np.log(np.asarray(dist_units, dtype=np.float64)) + gumbel(seed, position, ids)
    return _argmax_lowest_id(score, ids)


def coupled_draft(q: np.ndarray, seed: int, position: int) -> int:
    """The drafter's draft x at `position`: argmax log q + G over q's vocabulary.

    q: [V] float probabilities (>= 0, any scale; zeros are never chosen); ties to the lowest id.
    """
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore"):
        score = np.log(q) + gumbel(seed, position, np.arange(len(q)))
    if not np.isfinite(score.max()):
        raise ValueError("q has no positive entry")
    return int(np.argmax(score))  # first maximum = lowest id


def acceptance_rate(p: np.ndarray, q: np.ndarray, rows: int = 64) -> float:
    """Exact P(x == y) of the coupling for dense p [V], q [V] float (each summing to 1).

    Gumbel-max is an exponential race (x = argmin E_i / q_i, y = argmin E_i / p_i, E_i ~
    Exp(1) shared), so P(x = y = i) = 1 / sum_j max(p_j / p_i, q_j / q_i). Computed in
    blocks of `rows` candidates i to bound memory at rows x V.
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    both = np.nonzero((p > 0) & (q > 0))[0]
    total = 0.0
    for start in range(0, len(both), rows):
        i = both[start:start + rows]
        race = np.maximum(p[None, :] / p[i, None], q[None, :] / q[i, None])  # [rows, V]
        total += float((1.0 / race.sum(axis=1)).sum())
    return total
