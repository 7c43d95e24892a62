"""What the speculation learns from verdicts: P(accept) of a draft from the drafter's
confidence, and P(recovered token = the drafter's r-th alternative | rejection). Both are
calibrated online (every walk and every Decided token reveals outcomes) and read by the
planners of both trees (acespec.edge.speculation.branches, .grow_tree)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RecoveryModel:
    """P(recovered token = the drafter's r-th alternative | rejection): the rank (in the
    drafter's order, the draft itself skipped) of every recovered token the downlink
    revealed, counted; blended with the drafter's own renormalised probability through a
    prior worth `prior` observations. Index `guesses` counts "none of the guesses"."""

    guesses: int = 2
    prior: float = 8.0
    counts: np.ndarray | None = None  # [guesses + 1]

    def __post_init__(self):
        if self.counts is None:
            self.counts = np.zeros(self.guesses + 1)

    def observe(self, rank: int) -> None:
        self.counts[min(rank, self.guesses)] += 1

    def p(self, rank: int, drafter_p: float) -> float:
        n = self.counts.sum()
        return float((self.counts[rank] + self.prior * drafter_p) / (n + self.prior))


@dataclass
class AcceptanceModel:
    """P(accept) of a draft from its confidence (the drafter's plain softmax at the draft:
    q itself is one-hot under greedy decoding), calibrated online: Beta(2, 1) prior per bin
    of confidence, updated with every verdict the walk reveals."""

    bins: int = 10
    accepted: np.ndarray = field(default_factory=lambda: np.full(10, 2.0))
    total: np.ndarray = field(default_factory=lambda: np.full(10, 3.0))

    def _bin(self, qx: float) -> int:
        return min(self.bins - 1, int(qx * self.bins))

    def p(self, qx: float) -> float:
        b = self._bin(qx)
        return float(self.accepted[b] / self.total[b])

    def update(self, qx: float, accepted: bool) -> None:
        b = self._bin(qx)
        self.total[b] += 1
        self.accepted[b] += accepted
