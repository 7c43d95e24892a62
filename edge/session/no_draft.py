"""The no-draft driver: a decided session in which the edge drafts nothing.

The verifier decides every token alone and speculates for itself: its gap drafter beside the
target (`colo`, co-located speculation) or prompt lookup over the session's text
(`cloud-lookup`). The edge only streams the decided text to its user. These are the rivals
AceSpec's own drafts are measured against (docs/benchmarks.md), run through the same
verifier, link and accounting.
"""

from __future__ import annotations

from acespec.edge.session.decided import DecidedDriver


class NoDraftDriver(DecidedDriver):
    """One connection attempt of a decided session with no edge drafts."""

    async def work(self) -> bool:
        return False  # only the downlink can help

    def take_tokens(self, tokens: list[int]) -> None:
        for t in tokens:
            self.run.emit([t])
            if self.run.finished:
                break
