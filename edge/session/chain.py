"""The chain driver: a decided session over `Drafts`/`Decided` (docs/design.md §3).

The edge drafts ahead of the decided text and streams its chain up as `Drafts`; the
verifier scores, decides and keeps decoding on its own. Each decided token is compared with
the chain: equal, the draft was accepted; different, the chain from there is dead and
drafting restarts from the decided text.
"""

from __future__ import annotations

from dataclasses import dataclass

from acespec.edge.session.decided import DecidedDriver


@dataclass
class Chain:
    """The edge's drafts beyond its committed text, all sent."""

    tokens: list[int]  # [n] drafts at positions committed_end .. committed_end + n - 1

    def take(self, token: int) -> bool | None:
        """A decided token at the chain's first position: True = the draft was accepted,
        False = rejected (the chain is dead), None = there was no draft (continuation)."""
        if not self.tokens:
            return None
        if self.tokens[0] == token:
            self.tokens.pop(0)
            return True
        self.tokens.clear()
        return False


class ChainDriver(DecidedDriver):
    """One connection attempt of a decided session with one chain of drafts."""

    def __init__(self, run, sess, inbox):
        super().__init__(run, sess, inbox)
        self.chain = Chain([])

    async def work(self) -> bool:
        if self._may_draft():
            await self._draft_and_send()
            return True
        return False

    def _may_draft(self) -> bool:
        run = self.run
        left = run.cfg.max_tokens - len(run.out) - len(self.chain.tokens)
        return left > 0 and len(self.chain.tokens) + self.depth <= self.window

    async def _draft_and_send(self) -> None:
        run = self.run
        behind = len(self.chain.tokens)
        context = run.context + self.chain.tokens
        left = run.cfg.max_tokens - len(run.out) - behind
        draft = await run.propose(context, max(1, min(self.depth, left)), run.seq)
        tokens = draft.tokens.tolist()
        await self.guarded(self.sess.drafts(len(context), behind, tokens))
        self.chain.tokens += tokens

    def take_tokens(self, tokens: list[int]) -> None:
        stats = self.run.stats
        for t in tokens:
            verdict = self.chain.take(t)
            stats.accepted += verdict is True
            stats.cache.rejections += verdict is False
            self.run.emit([t])
            if self.run.finished:
                break
