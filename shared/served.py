"""The served distribution p~ and its sparse downlink form (docs/design.md §5).

p~ for a node: target logits -> temperature -> top-k (k <= k_max; 0 means k_max) -> softmax
-> top-p -> quantise to integer units of 2^-16 (largest remainder, sum exactly 65536).
What top-k/top-p cut has p~ = 0 (it is *not* tail). The cloud sends the smallest set of top
entries whose mass reaches `send_mass`; the rest of p~'s support is the tail: its mass plus
m tokens pre-drawn from p~ restricted to the tail. Greedy is one id. Pure numpy; tail samples
come from a counter-based stream keyed by (seed, position).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from acespec.shared.config import ConfigError, SamplingParams
from acespec.shared.coupled import coupled_target
from acespec.shared.sampling import tempered

UNITS = 1 << 16  # probability 1 in units of 2^-16
MAX_TAIL_SAMPLES = 64


@dataclass(frozen=True)
class ServeParams:
    """How the cloud serves p~ for a session."""

    sampling: SamplingParams = SamplingParams()
    k_max: int = 64  # most entries p~ may have (caps top_k; top_k=0 means k_max)
    send_mass: float = 0.9  # send the smallest top set whose mass reaches this
    tail_samples: int = 2  # m pre-drawn tail samples per node

    def __post_init__(self) -> None:
        if not 1 <= self.k_max <= 4096:
            raise ConfigError(f"k_max must be in [1, 4096], got {self.k_max}")
        if not 0 < self.send_mass <= 1:
            raise ConfigError(f"send_mass must be in (0, 1], got {self.send_mass}")
        if not 0 <= self.tail_samples <= MAX_TAIL_SAMPLES:
            raise ConfigError(f"tail_samples must be in [0, {MAX_TAIL_SAMPLES}], "
                              f"got {self.tail_samples}")

    @property
    def k(self) -> int:
        top_k = self.sampling.top_k
        return self.k_max if top_k == 0 else min(top_k, self.k_max)


@dataclass(frozen=True)
class ServedDist:
    """p~ of one node: its support in descending probability order (ties: lower id first)."""

    ids: np.ndarray  # [k] int64 token ids
    units: np.ndarray  # [k] int64 probabilities in units of 2^-16, all > 0, sum UNITS

    def units_of(self, token: int) -> int:
        hit = np.nonzero(self.ids == token)[0]
        return int(self.units[hit[0]]) if len(hit) else 0


@dataclass(frozen=True)
class NodeScore:
    """What the downlink says about one node: the wire form of p~ (ids ascending)."""

    node_id: int
    self_units: int  # p~(this node's token | parent), units; 0 for the root
    ids: np.ndarray  # [s] int64 sent token ids, ascending
    units: np.ndarray  # [s] int64 their units
    tail_units: int  # mass of p~ not sent
    tail_ids: np.ndarray  # [m] int64 pre-drawn tail samples z ~ p~ restricted to the tail
    tail_sample_units: np.ndarray  # [m] int64 p~(z) for each sample

    @property
    def greedy_token(self) -> int:
        return int(self.ids[0])


def quantize(probs: np.ndarray) -> np.ndarray:
    """[k] float probabilities (sum ~1) -> [k] int64 units summing to UNITS exactly.
    Largest remainder: floor, then one more unit to the largest remainders (earlier first)."""
    scaled = probs / probs.sum() * UNITS
    units = np.floor(scaled).astype(np.int64)
    short = UNITS - int(units.sum())
    if short > 0:
        order = np.argsort(-(scaled - units), kind="stable")
        units[order[:short]] += 1
    return units


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, ties at the k-th value taken lowest id first (so the
    choice is a function of the logits alone, as in the fused encoder kernel)."""
    if k >= len(logits):
        return np.arange(len(logits))
    kth = np.partition(logits, len(logits) - k)[len(logits) - k]  # the k-th largest
    above = np.nonzero(logits > kth)[0]
    return np.concatenate([above, np.nonzero(logits == kth)[0][: k - len(above)]])


def served(logits: np.ndarray, params: ServeParams) -> ServedDist:
    """p~ for one node from its logits [V] (any float dtype)."""
    s = params.sampling
    if s.greedy:  # the argmax, in the logits' own dtype (widening keeps order and ties)
        return ServedDist(ids=np.array([int(np.argmax(logits))]), units=np.array([UNITS]))
    logits = np.asarray(logits, dtype=np.float64)
    k = min(params.k, len(logits))
    top = _top_k(logits, k)
    top = top[np.lexsort((top, -logits[top]))]  # descending logit, lower id on ties
    probs = np.exp(tempered(logits[top], s.temperature))  # tiny temperatures: the argmax
    probs /= probs.sum()
    if s.top_p < 1.0:
        keep = (np.cumsum(probs) - probs) < s.top_p
        top, probs = top[keep], probs[keep]
    units = quantize(probs)
    nz = units > 0
    top, units = top[nz], units[nz]
    order = np.lexsort((top, -units))  # quantisation can reorder near-ties
    return ServedDist(ids=top[order], units=units[order])


def tail_uniforms(seed: int, position: int, start: int, count: int) -> np.ndarray:
    """Uniforms number [start, start+count) of the tail stream of the node deciding
    `position`: [count] float64 in [0, 1). The stream is a function of (session seed,
    position) only, so a re-opened session (new node ids) draws the same samples. Counter
    based (Philox4x64 keyed by a hash of (seed, position)): the i-th uniform costs O(1)
    whatever i, so `MoreTail` never replays the samples already sent."""
    key = np.random.SeedSequence([seed & (2**64 - 1), position, 2]).generate_state(2, np.uint64)
    skip = start % 4  # each counter step yields 4 uint64 words
    raw = np.random.Philox(key=key, counter=start // 4).random_raw(skip + count)[skip:]
    return (raw >> np.uint64(11)) * 2.0**-53  # 53 random bits, as Generator.random()


def tail_draws(dist: ServedDist, n_sent: int, seed: int, position: int, start: int,
               count: int) -> tuple[np.ndarray, np.ndarray]:
    """Tail samples number [start, start+count) of a node deciding `position`: (ids [count],
    units [count]), each z ~ p~ restricted to the tail (inverse CDF of one uniform, as
    numpy's Generator.choice). Deterministic, so `MoreTail` continues the stream Scores
    began; O(count) whatever start."""
    tail_ids, tail_units = dist.ids[n_sent:], dist.units[n_sent:]
    if len(tail_ids) == 0 or count == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cdf = np.cumsum(tail_units / tail_units.sum())  # [tail] float64
    cdf /= cdf[-1]
    picks = np.searchsorted(cdf, tail_uniforms(seed, position, start, count), side="right")
    return tail_ids[picks], tail_units[picks]


def n_sent(dist: ServedDist, send_mass: float) -> int:
    """Entries sent: the smallest top set whose mass reaches send_mass."""
    need = send_mass * UNITS
    return int(min(len(dist.units), np.searchsorted(np.cumsum(dist.units), need - 1e-9) + 1))


def node_score(dist: ServedDist, params: ServeParams, node_id: int, self_units: int,
               seed: int, position: int | None = None) -> NodeScore:
    """The wire form of p~ for one node; `position` (of the token p~ decides) keys the tail
    samples (default: node_id, for callers without positions)."""
    if params.sampling.decided:  # one id: the token the target decides after this node
        empty = np.zeros(0, np.int64)
        if params.sampling.greedy:
            return NodeScore(node_id, self_units, dist.ids[:1], dist.units[:1], 0, empty, empty)
        y = coupled_target(dist.ids, dist.units, seed, node_id if position is None else position)
        return NodeScore(node_id, self_units, np.array([y]), np.array([UNITS]), 0, empty, empty)
    s = n_sent(dist, params.send_mass)
    order = np.argsort(dist.ids[:s])
    z_ids, z_units = tail_draws(dist, s, seed, node_id if position is None else position, 0,
                               params.tail_samples)
    return NodeScore(node_id=node_id, self_units=self_units, ids=dist.ids[:s][order],
                     units=dist.units[:s][order], tail_units=int(dist.units[s:].sum()),
                     tail_ids=z_ids, tail_sample_units=z_units)


def sample_served(dist: ServedDist, u: float) -> int:
    """Inverse-CDF draw from p~ with one uniform u in [0, 1) (support order)."""
    cum = np.cumsum(dist.units)
    return int(dist.ids[min(np.searchsorted(cum, u * UNITS, side="right"), len(cum) - 1)])


def coupled_verdict(draft: int, dist: ServedDist, seed: int, position: int) -> tuple[bool, int]:
    """The verifier's decision on a draft token at `position` (coupled sampling, docs/design.md
    §5): (accepted, y). y is the decided token either way (the draft itself when accepted, the
    recovered token otherwise)."""
    y = coupled_target(dist.ids, dist.units, seed, position)
    return bool(draft == y), y
