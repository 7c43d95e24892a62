"""How loaded the verifier's passes are, for load-aware speculation (docs/design.md §3).

A node scored in a shared pass costs every session in it: the pass takes longer by the
marginal cost of one node (the slope of the measured cost line at the pass's size, zero
below a GPU's knee). A speculative node is worth scoring while what it is expected to
decide per second of that marginal cost is at least what the pass decides per second on
average. Idle, every pass is one session's and the verifier speculates as much as pays
for it (its own proposals, as co-located speculation would); saturated, the slope is
steep and the pass decides many tokens, so it scores the edge's most likely drafts only
and proposes nothing of its own. Verdicts never depend on it: it changes speed, not output.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.9  # per pass: the load follows the last ~10 passes


@dataclass
class Pressure:
    """Decayed averages of the recent passes: nodes and sessions per pass, and tokens one
    session's pass decides."""

    nodes: float = 1.0  # per pass
    sessions: float = 1.0  # per pass
    tokens: float = 1.0  # decided per session per pass

    def on_pass(self, sessions: int, nodes: int) -> None:
        self.nodes = DECAY * self.nodes + (1 - DECAY) * nodes
        self.sessions = DECAY * self.sessions + (1 - DECAY) * max(1, sessions)

    def on_decided(self, tokens: int) -> None:
        """One session's pass decided `tokens`."""
        self.tokens = DECAY * self.tokens + (1 - DECAY) * max(1, tokens)

    def others(self, mine: int) -> tuple[int, float]:
        """What the other sessions are expected to bring to a pass besides `mine` nodes:
        (nodes, tokens decided)."""
        others = max(0.0, self.sessions - 1)
        nodes = max(0.0, self.nodes - self.nodes / self.sessions)
        return int(round(nodes)), others * self.tokens

    def worth(self, acceptance: float, seconds) -> bool:
        """Is a speculative node accepted with probability `acceptance` worth its marginal
        cost in a pass like the recent ones? seconds(n): a pass of n nodes (the measured
        line). True while the cost line is flat there."""
        n = max(1, int(round(self.nodes)))
        slope = seconds(n + 1) - seconds(n)
        if slope <= 0:
            return True
        per_second = self.sessions * self.tokens / max(seconds(n), 1e-9)
        return acceptance / slope >= per_second
