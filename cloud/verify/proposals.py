"""How many of its own proposals the verifier scores in a lone pass (docs/design.md §3).

A lone pass (no edge draft at the decided end) decides one token and, where the verifier's
proposals (prompt lookup, or a gap drafter) agree with it, one more per proposal it walks.
It scores the number of proposals that decides the most tokens per second of pass: one plus
the chances that the walk gets that far and takes each (products of conditional acceptance
rates), over what a pass of that size costs. Both sides are measured here, over all sessions
(one target, one kind of traffic), recent passes weighing most:

- `Depth.rate(order, i)`: P(proposal i is taken | proposals 0..i-1 were), by the n-gram
  order prompt lookup matched (1, 2, 3+: a longer match is likelier to go on; a gap drafter's
  are order 0), from the walks of earlier passes (a Beta(1, 1) prior);
- `PassCost`: the pass's seconds by its input tokens: the median of the recent passes of
  that size where there are enough of them, else a least-squares line over all recent
  passes. A line alone misreads a step: on a CPU whose matrix library has a slow path for
  2-3 rows (MKL's `F.linear`; figures in docs/benchmarks.md §5) a pass of 2 tokens costs
  far more than a pass of 1 while the line's slope stays small, so the line undercharges the
  first proposal. The verifier's default oneDNN-prepacked linears
  (acespec.cloud.target.packed) make that pass nearly flat up to 8 tokens; the per-size
  reading follows whichever the machine has.

Verdicts never depend on the proposals, so none of this changes any output: it only trades
nodes against passes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

DECAY = 0.995  # per settled pass: the rates follow the traffic over the last ~200 passes
ORDERS = 4  # order buckets: 0 (a gap drafter), 1, 2, 3+ (prompt lookup's n-gram length)
FIT_PASSES = 64  # the pass-cost line is fitted to this many recent passes
SIZE_PASSES = 16  # a size's cost is the median of its last this many passes
SIZE_SEEN = 3  # ... once this many were timed (the line's value before)
EXPLORE = 16  # an order found not worth a proposal still gets one in this many lone passes
HINGE_GAIN = 0.25  # a flat-then-linear cost replaces the line where its error is this small
HINGE_EVERY = 16  # passes between refits of it


def worth_depth(rates, cost: Callable[[int], float], fed: int = 1,
                extra_s: float = 0.0, base_nodes: int = 0, base_tokens: float = 0.0) -> int:
    """How many proposals to score: the depth d with the most expected tokens per second of
    the whole pass, (base_tokens + 1 + the sum of the first d reach probabilities) /
    (cost(base_nodes + fed + d) + d * extra_s), where reach is the product of the
    conditional rates so far, cost(n) a pass of n input tokens, `fed` the session's tokens
    before any proposal, base_nodes and base_tokens what the other sessions in the pass
    bring and decide (acespec.cloud.verify.pressure; 0 when idle) and extra_s what a
    proposal costs besides its node (a gap drafter's decode). Ties go to the shallower
    depth; none while no pass was timed (cost 0)."""
    if cost(base_nodes + fed) <= 0:
        return 0
    tokens, reach = base_tokens + 1.0, 1.0
    best_d, best = 0, tokens / cost(base_nodes + fed)
    for d, rate in enumerate(rates, start=1):
        reach *= rate
        tokens += reach
        rate_now = tokens / max(cost(base_nodes + fed + d) + d * extra_s, 1e-9)
        if rate_now > best * (1 + 1e-9):
            best_d, best = d, rate_now
    return best_d


@dataclass
class PassCost:
    """Seconds per pass against its input tokens, from the recent passes."""

    passes: deque = field(default_factory=lambda: deque(maxlen=FIT_PASSES))  # (tokens, s)
    by_size: dict = field(default_factory=dict)  # tokens -> deque of its recent passes' s
    _fit: tuple[float, float] | None = None  # (base s, s per token) of the current passes
    _median: dict = field(default_factory=dict)  # tokens -> the median of by_size's, until
    # a pass of that size is observed (every session's depth asks it for every size, per pass)
    _hinge: tuple[float, float, int] | None = None  # (base s, s per token, knee)
    _since_hinge: int = 0  # passes observed since the hinge was fitted

    def observe(self, tokens: int, seconds: float) -> None:
        self.passes.append((float(tokens), float(seconds)))
        self.by_size.setdefault(int(tokens), deque(maxlen=SIZE_PASSES)).append(float(seconds))
        self._median.pop(int(tokens), None)
        self._fit = None
        self._since_hinge += 1

    def fit(self) -> tuple[float, float]:
        """(a pass's base seconds, seconds per input token): the line through the recent
        passes (slope clipped to [0, base]; (mean, 0) while their sizes do not differ)."""
        if self._fit is None:
            n, s = (np.array(self.passes).T if self.passes else (np.zeros(1), np.zeros(1)))
            if len(self.passes) < 8 or np.ptp(n) < 2:
                self._fit = (float(np.mean(s)), 0.0)
            else:
                slope, base = np.polyfit(n, s, 1)
                base = max(float(base), float(np.min(s)) / 2)
                self._fit = (base, float(np.clip(slope, 0.0, base)))
        return self._fit

    def hinge(self) -> tuple[float, float, int]:
        """(base seconds, seconds per token beyond the knee, knee): flat up to a knee, then
        linear, where that fits the recent passes far better than the line (HINGE_GAIN: a
        GPU below its knee, or its emulation), else the line with knee 0. Refitted every
        HINGE_EVERY passes."""
        if self._hinge is None or self._since_hinge >= HINGE_EVERY:
            self._hinge, self._since_hinge = self._fit_hinge(), 0
        return self._hinge

    def _fit_hinge(self) -> tuple[float, float, int]:
        base, slope = self.fit()
        if len(self.passes) < 8:
            return base, slope, 0
        n, s = np.array(self.passes).T
        best, sse_line = (base, slope, 0), float(np.sum((s - base - slope * n) ** 2))
        sse_best = HINGE_GAIN * sse_line
        for knee in np.unique(n)[1:-1]:
            x = np.maximum(0.0, n - knee)
            b1, b0 = np.polyfit(x, s, 1)
            sse = float(np.sum((s - b0 - b1 * x) ** 2))
            if b1 > 0 and b0 > 0 and sse < sse_best:
                best, sse_best = (float(b0), float(b1), int(knee)), sse
        return best

    def slope(self, tokens: int) -> float:
        """Seconds one more input token adds to a pass of `tokens` (the fitted cost's slope
        there: zero below a knee)."""
        _, per_token, knee = self.hinge()
        return per_token if tokens >= knee else 0.0

    def seconds(self, tokens: int) -> float:
        """A pass of `tokens` input tokens: the median of the recent passes of that size
        once SIZE_SEEN of them were timed, else the fitted line's (or hinge's) value."""
        if (median := self._median.get(int(tokens))) is not None:
            return median
        seen = self.by_size.get(int(tokens))
        if seen is not None and len(seen) >= SIZE_SEEN:
            median = self._median[int(tokens)] = float(np.median(seen))
            return median
        base, per_token, knee = self.hinge()
        return base + per_token * max(0, tokens - knee)


@dataclass
class Depth:
    """Conditional acceptance of the verifier's proposals by order and depth (decayed
    counts), and the depth worth scoring."""

    max_depth: int
    taken: np.ndarray = field(init=False)  # [ORDERS, max_depth]
    tried: np.ndarray = field(init=False)  # [ORDERS, max_depth]: reached by the walk
    cost: PassCost = field(default_factory=PassCost)
    skipped: np.ndarray = field(init=False)  # [ORDERS]: lone passes since one was proposed

    def __post_init__(self) -> None:
        self.taken = np.ones((ORDERS, self.max_depth))  # Beta(1, 1): 1/2 before evidence
        self.tried = np.full((ORDERS, self.max_depth), 2.0)
        self.skipped = np.zeros(ORDERS, int)

    def rate(self, order: int, i: int) -> float:
        o = min(order, ORDERS - 1)
        return float(self.taken[o, i] / self.tried[o, i])

    def depth(self, order: int, room: int, fed: int = 1, extra_s: float = 0.0,
              base: tuple[int, float] = (0, 0.0)) -> int:
        """Proposals worth scoring (at most room) in a pass of `fed` tokens besides them and
        `base` (the other sessions' nodes and the tokens they decide): the depth that
        decides the most tokens per second of the pass (worth_depth). One in EXPLORE lone
        passes of an order found not worth any still scores one, so its rate can recover
        when the text changes."""
        o, n = min(order, ORDERS - 1), min(room, self.max_depth)
        rates = (self.taken[o, :n] / self.tried[o, :n]).tolist()
        d = worth_depth(rates, self.cost.seconds, fed, extra_s, *base)
        if d or not room:
            self.skipped[o] = 0
        elif (skipped := self.skipped[o] + 1) >= EXPLORE:
            self.skipped[o], d = 0, 1
        else:
            self.skipped[o] = skipped
        return d

    def settle(self, order: int, proposed: int, accepted: int) -> None:
        """A pass scored `proposed` of this order's proposals and its walk took the first
        `accepted`: proposals 0..accepted were reached, 0..accepted-1 taken."""
        o = min(order, ORDERS - 1)
        self.taken *= DECAY
        self.tried *= DECAY
        reached = min(proposed, accepted + 1, self.max_depth)
        self.tried[o, :reached] += 1
        self.taken[o, :min(accepted, reached)] += 1
