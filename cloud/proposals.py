"""How many of its own proposals the verifier scores in a lone pass (DESIGN §5).

A lone pass (no edge draft at the decided end) decides one token and, where the verifier's
proposals (prompt lookup, or a gap drafter) agree with it, one more per proposal it walks.
The i-th proposal is worth scoring while the chance that the walk gets that far and takes it
(the product of the first i conditional acceptance rates) times a pass is more than what the
node adds to the pass. Both sides are measured here, over all sessions (one target, one kind
of traffic), recent passes weighing most:

- `Depth.rate(order, i)`: P(proposal i is taken | proposals 0..i-1 were), by the n-gram
  order prompt lookup matched (1, 2, 3+: a longer match is likelier to go on; a gap drafter's
  are order 0), from the walks of earlier passes (a Beta(1, 1) prior);
- `PassCost`: the pass's seconds against its input tokens, a least-squares line over the
  recent passes: the slope is one node's cost (0 on a device that scores a few more tokens
  for free, 0.5 ms on the 40,0.5 profile), the intercept what a saved pass is worth.

Verdicts never depend on the proposals, so none of this changes any output: it only trades
nodes against passes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

DECAY = 0.995  # per settled pass: the rates follow the traffic over the last ~200 passes
ORDERS = 4  # order buckets: 0 (a gap drafter), 1, 2, 3+ (prompt lookup's n-gram length)
FIT_PASSES = 64  # the pass-cost line is fitted to this many recent passes
EXPLORE = 16  # an order found not worth a proposal still gets one in this many lone passes


def worth_depth(rates, pass_s: float, node_s: float) -> int:
    """How many proposals to score: while the chance that the walk takes all of them so far
    (the product of the conditional rates, in order) times a pass (what taking the last one
    saves) is more than one node costs (node_s: its share of the pass, and any drafting)."""
    reach, d = 1.0, 0
    for rate in rates:
        reach *= rate
        if reach * pass_s <= node_s:
            break
        d += 1
    return d


@dataclass
class PassCost:
    """Seconds per pass against its input tokens, from the recent passes."""

    passes: deque = field(default_factory=lambda: deque(maxlen=FIT_PASSES))  # (tokens, s)
    _fit: tuple[float, float] | None = None  # (base s, s per token) of the current passes

    def observe(self, tokens: int, seconds: float) -> None:
        self.passes.append((float(tokens), float(seconds)))
        self._fit = None

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

    def depth(self, order: int, room: int) -> int:
        """Proposals worth scoring (at most room): while P(the walk takes the next one) times
        a pass is more than the node costs. One in EXPLORE lone passes of an order found not
        worth any still scores one, so its rate can recover when the text changes."""
        base, per_node = self.cost.fit()
        rates = [self.rate(order, i) for i in range(min(room, self.max_depth))]
        d = worth_depth(rates, base, per_node)
        o = min(order, ORDERS - 1)
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
