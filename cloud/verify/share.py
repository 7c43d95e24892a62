"""Each session's share of the verifier's passes (docs/design.md §3).

A pass scores, for every session in it, the node it must (the next token to decide) and up
to `Share.nodes()` speculative nodes besides. That share is earned: it grows with what the
session's speculation returns, accepted tokens per speculative node scored, measured over
its recent passes. A session whose drafts are never taken gets FLOOR node per pass beyond
what it must decide; since the share only grows with acceptance, it never gets more than a
peer whose drafts are taken more often. What a session wastes thus costs the others at most
FLOOR node of every pass, however much it sends.

Verdicts never depend on how many nodes a pass scores, so the share changes no output; it
only decides how much of each pass a session may spend on speculation.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR = 1  # speculative nodes a pass holds for a session whatever its record
PRIOR_SCORED = 8.0  # a new session's record: as if PRIOR_ACCEPTED of PRIOR_SCORED nodes
PRIOR_ACCEPTED = 4.0  # ... were taken, so it starts with half the cap
DECAY = 0.9  # per settled pass: the record follows the last ~10 passes


@dataclass
class Share:
    """A session's speculation record (decayed counts) and the nodes per pass it earns."""

    cap: int  # the most speculative nodes one pass may score for one session
    scored: float = PRIOR_SCORED  # decayed speculative nodes scored
    accepted: float = PRIOR_ACCEPTED  # decayed tokens they gave
    total_scored: int = 0
    total_accepted: int = 0

    @property
    def efficiency(self) -> float:
        """Accepted tokens per speculative node scored, recently, in [0, 1]."""
        return min(1.0, self.accepted / self.scored) if self.scored > 0 else 1.0

    def nodes(self) -> int:
        """Speculative nodes the session's next pass may score: FLOOR plus its efficiency's
        part of the rest of the cap."""
        return min(self.cap, FLOOR + int(self.efficiency * max(0, self.cap - FLOOR)))

    def grant(self) -> int:
        """Nodes of one request the batcher scores per pass: the one the session must
        decide and its share."""
        return 1 + self.nodes()

    def settle(self, scored: int, accepted: int = 0) -> None:
        """A pass scored `scored` speculative nodes of the session and `accepted` of them
        (or, for an edge-decided session, of earlier passes' nodes: its commits) were taken."""
        self.scored = DECAY * self.scored + scored
        self.accepted = DECAY * self.accepted + accepted
        self.total_scored += scored
        self.total_accepted += accepted

    def charge(self, nodes: float) -> None:
        """Work done for the session besides its nodes (its grammar's masks), as the nodes a
        pass would score meanwhile: counted as scored and not taken."""
        self.scored += nodes

    def accept(self, accepted: int) -> None:
        """Tokens taken later than their pass (an edge-decided session's Commit)."""
        self.accepted += accepted
        self.total_accepted += accepted

    @property
    def wasted(self) -> int:
        """Speculative nodes scored and never taken, since the session opened."""
        return max(0, self.total_scored - self.total_accepted)
