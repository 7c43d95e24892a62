"""How full the verifier's passes are, for load-aware speculation (docs/design.md §3).

A node scored in a shared pass costs every session in it: the pass takes longer by the
marginal cost of one node (the slope of the measured cost line at the pass's size; zero
below a GPU's knee). A speculative node is worth scoring while what it is expected to decide
per second of that marginal cost is at least what the pass decides per second on average.
Idle, every pass is one session's and the verifier speculates as deep as pays for it (its
own proposals, as co-located speculation would); beyond the knee and full of sessions, the
slope is steep and the pass decides many tokens, so it scores only likely nodes. Verdicts
never depend on it: it changes speed, not output.
"""

from __future__ import annotations

from dataclasses import dataclass

from acespec.cloud.verify.proposals import PassCost
from acespec.cloud.verify.share import FLOOR, Share

DECAY = 0.9  # per pass: the load follows the last ~10 passes


@dataclass
class Pressure:
    """Decayed averages of the recent passes: nodes and sessions per pass, and the tokens
    one session's pass decides."""

    nodes: float = 1.0  # per pass
    sessions: float = 1.0  # per pass
    tokens: float = 1.0  # decided per session per pass

    def on_pass(self, sessions: int, nodes: int) -> None:
        self.nodes = DECAY * self.nodes + (1 - DECAY) * nodes
        self.sessions = DECAY * self.sessions + (1 - DECAY) * max(1, sessions)

    def on_decided(self, tokens: int) -> None:
        """One session's pass decided `tokens`."""
        self.tokens = DECAY * self.tokens + (1 - DECAY) * max(1, tokens)

    def others(self) -> tuple[int, float]:
        """What the other sessions are expected to bring to a pass: (nodes, tokens they
        decide)."""
        others = max(0.0, self.sessions - 1)
        nodes = self.nodes * others / self.sessions
        return int(round(nodes)), others * self.tokens

    def worth(self, acceptance: float, cost: PassCost) -> bool:
        """Is a speculative node taken with probability `acceptance` worth its marginal cost
        in a pass like the recent ones (cost: the passes' measured cost)? True while the
        cost is flat there."""
        n = max(1, int(round(self.nodes)))
        slope = cost.slope(n)
        if slope <= 0:
            return True
        per_second = self.sessions * self.tokens / max(cost.seconds(n), 1e-9)
        return acceptance / slope >= per_second

    def budget(self, share: Share, cost: PassCost) -> int:
        """Speculative nodes a decided session's next pass may score: its earned share, or
        the floor while a node taken as often as its nodes are is not worth its marginal
        cost in passes as full as the recent ones."""
        return share.nodes() if self.worth(share.efficiency, cost) else FLOOR
