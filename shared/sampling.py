"""Logits -> next-token distribution: temperature -> top-k -> top-p -> renormalise.

The drafter's q and the cloud's served distribution p~ use this same transform (the
cloud then quantises p~ to uint16 units); numpy only, so the edge needs no torch.
"""

from __future__ import annotations

import numpy as np

from acespec.shared.config import SamplingParams
from acespec.shared.coupled import coupled_draft


def tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """(logits - max) / temperature along the last axis of float64 logits [..., V].

    Shifting before dividing keeps every entry <= 0 (the maxima exactly 0), so nothing
    overflows to inf - inf for any temperature > 0, down to 5e-324: a gap too large for a tiny
    temperature becomes -inf, probability 0. So a tiny temperature gives the limit of the
    softmax, the one-hot at the argmax (spread evenly over exactly tied maxima).
    """
    shifted = logits - logits.max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):  # gap / temperature beyond float range: -inf, as meant
        return shifted / temperature


def transform(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Next-token distributions from logits.

    logits: [n, V] float (any float dtype). Returns [n, V] float64 rows summing to 1.
    Greedy gives a one-hot row at the argmax (lowest id on ties); any temperature > 0 is
    computed in shifted log space (`tempered`), so a tiny one gives the argmax's one-hot.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(f"logits must be [n, V], got shape {logits.shape}")
    n, vocab = logits.shape
    if params.greedy:
        probs = np.zeros((n, vocab))
        probs[np.arange(n), logits.argmax(axis=1)] = 1.0
        return probs
    scaled = tempered(logits, params.temperature)
    if 0 < params.top_k < vocab:
        # Everything strictly below the k-th largest logit is cut. Compared unshifted: the
        # shift by the maximum may round logits a hair apart into a tie.
        kth = np.partition(logits, vocab - params.top_k, axis=1)[:, vocab - params.top_k]
        scaled = np.where(logits >= kth[:, None], scaled, -np.inf)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        probs = _top_p(probs, logits, params.top_p)
    return probs


def _top_p(probs: np.ndarray, logits: np.ndarray, top_p: float) -> np.ndarray:
    """Keep, per row, the smallest set of most likely tokens whose mass reaches top_p.
    Ranked by logits (finer than probabilities), lowest id first on ties, like argmax."""
    order = np.argsort(-logits, axis=1, kind="stable")  # [n, V]
    sorted_p = np.take_along_axis(probs, order, axis=1)
    before = np.cumsum(sorted_p, axis=1) - sorted_p  # mass strictly before each entry
    keep_sorted = before < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    out = np.where(keep, probs, 0.0)
    return out / out.sum(axis=1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a [V] distribution with the caller's RNG (inverse CDF, one uniform)."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))


class PositionalRng:
    """A stand-in for `numpy.random.Generator` whose k-th `random()` call returns the uniform
    of position start+k: a function of (seed, position, purpose) only. Drafting with it makes
    each drafted token depend on its position, not on how drafting was chunked, so a session
    resumed mid-chunk draws exactly what an uninterrupted one would. (`sample` and the
    drafters draw one uniform per token.)"""

    def __init__(self, seed: int, start: int, purpose: int = 0):
        self.seed, self.position, self.purpose = seed, start, purpose

    def random(self) -> float:
        u = np.random.default_rng([self.seed, self.position, self.purpose]).random()
        self.position += 1
        return float(u)

    def coupled(self, q: np.ndarray) -> int:
        """The coupled draft of q [V] at the next position: argmax log q + G(seed, position)
        (the verifier uses the same noise; docs/design.md §5)."""
        x = coupled_draft(q, self.seed, self.position)
        self.position += 1
        return x
