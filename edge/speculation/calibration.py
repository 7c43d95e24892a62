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


@dataclass
class TimingModel:
    """P(in time | lead): that the verifier holds a node sent `lead` positions past the
    decided end (as the edge knew it) when it decides that position. The verifier decides
    alone while the node travels, so a node is late when its lead is below the verifier's
    advance meanwhile (`ahead`, from the round trip): that model is the prior (weight
    PRIOR_WEIGHT, per lead); every judged line draft updates its lead's bin."""

    size: int = 64
    held: np.ndarray = field(default_factory=lambda: np.zeros(64))
    judged: np.ndarray = field(default_factory=lambda: np.zeros(64))

    PRIOR_WEIGHT = 2.0
    EARLY, LATE = 0.9, 0.1  # the prior past and short of the verifier's advance

    def _bin(self, lead: int) -> int:
        return max(0, min(self.size - 1, lead))

    def observe(self, lead: int, held: bool) -> None:
        b = self._bin(lead)
        self.judged[b] += 1
        self.held[b] += held

    def p(self, lead: int, ahead: float) -> float:
        b = self._bin(lead)
        prior = self.EARLY if lead > ahead else self.LATE
        return float((self.held[b] + self.PRIOR_WEIGHT * prior)
                     / (self.judged[b] + self.PRIOR_WEIGHT))

