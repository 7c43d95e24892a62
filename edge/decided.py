"""The edge's side of a session the verifier decides (greedy and coupled; DESIGN §3).

The edge drafts ahead of the decided text and streams its chain up as `Drafts`; the
verifier scores, decides and keeps decoding on its own through every round trip, streaming
`Decided` tokens down. Here each decided token is compared with the chain: equal, the draft
was accepted; different, the chain from there is dead and drafting restarts from the
decided text. The edge still holds the committed text (a verifier that dies loses nothing:
its decisions are deterministic, so a re-opened session decides the same).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from acespec.edge.client import CloudSession, Decided


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


class DecidedDriver:
    """Runs one connection attempt of a decided session for an engine run (`_Run`)."""

    def __init__(self, run, sess: CloudSession):
        self.run, self.sess, self.chain = run, sess, Chain([])
        self.counted = False  # the verifier's final account has arrived
        self.write_failed = False
        # The verifier consumes drafts as fast as its passes run, and a chain that is short
        # of a round trip's worth leaves it decoding alone: the adaptive shape drafts up to
        # the widest window (dead drafts cost only uplink bytes, never a pass).
        cfg = run.cfg
        self.depth = cfg.depth if cfg.adaptive else run.shape.depth
        self.window = cfg.max_window if cfg.adaptive else run.shape.window

    @property
    def committed_end(self) -> int:
        return len(self.run.prompt) + len(self.run.out)

    async def drive(self, inbox: asyncio.Queue) -> None:
        run = self.run
        while not run.finished:
            # Take what the reader has handed over, so a verifier that decides faster than
            # the edge drafts is followed, not raced.
            await asyncio.sleep(0)
            while not inbox.empty() and not run.finished:
                self._take(inbox.get_nowait())
            if run.finished:
                break
            if self.write_failed:
                await self._finish_after_failed_write(inbox)
                break
            if await self._work():
                continue
            self._take(await inbox.get())
        if not self.counted:
            await self._final_counts(inbox)

    async def _work(self) -> bool:
        """Draft and send what is worth it now; False when only the downlink can help."""
        if self._may_draft():
            await self._draft_and_send()
            return True
        return False

    async def _guarded(self, write) -> None:
        """Await an uplink write. A verifier older than the linger of the session's end
        may have ended the stream after its last Decided while we were drafting: the write
        then fails, but the tokens are in the inbox; only without them is it a loss."""
        try:
            await write
        except (grpc.aio.AioRpcError, ConnectionError):
            self.write_failed = True

    async def _finish_after_failed_write(self, inbox: asyncio.Queue) -> None:
        """Read what the verifier sent before the stream ended; lost if it is not the end."""
        while not self.run.finished:
            self._take(await asyncio.wait_for(inbox.get(), 5.0))

    async def _final_counts(self, inbox: asyncio.Queue, timeout_s: float = 2.0) -> None:
        """The edge finished first (max_tokens or a stop it saw first): half-close; the
        verifier answers with its account of the session. Not worth waiting long for."""
        await self.sess.done_writing()
        try:
            await asyncio.wait_for(self._await_counts(inbox), timeout_s)
        except asyncio.TimeoutError:
            return

    async def _await_counts(self, inbox: asyncio.Queue) -> None:
        while not self.counted:
            msg = await inbox.get()
            msg = msg[0] if isinstance(msg, tuple) else msg
            if isinstance(msg, Exception):
                return
            if isinstance(msg, Decided) and msg.counts is not None:
                self.run.stats.add_verifier(msg.counts)
                self.counted = True

    def _may_draft(self) -> bool:
        run = self.run
        left = run.cfg.max_tokens - len(run.out) - len(self.chain.tokens)
        return left > 0 and len(self.chain.tokens) + self.depth <= self.window

    async def _draft_and_send(self) -> None:
        run = self.run
        behind = len(self.chain.tokens)
        context = run.prompt + run.out + self.chain.tokens
        left = run.cfg.max_tokens - len(run.out) - behind
        draft = await run.propose(context, max(1, min(self.depth, left)), run.seq)
        tokens = draft.tokens.tolist()
        await self._guarded(self.sess.drafts(len(context), behind, tokens))
        self.chain.tokens += tokens

    def _take_tokens(self, tokens: list[int]) -> None:
        """Compare decided tokens with the chain and commit them."""
        stats = self.run.stats
        for t in tokens:
            verdict = self.chain.take(t)
            stats.accepted += verdict is True
            stats.cache.rejections += verdict is False
            self.run._emit([t])
            if self.run.finished:
                break

    def _take(self, item) -> None:
        """Apply one downlink message (or raise the reader's error)."""
        msg = item[0] if isinstance(item, tuple) else item
        if isinstance(msg, grpc.aio.AioRpcError) and msg.code() != grpc.StatusCode.UNAVAILABLE:
            raise msg  # a refusal from the verifier: the caller decides, no blind retry
        if isinstance(msg, Exception):
            raise ConnectionError(str(msg)) from msg  # lost: the engine re-opens
        if not isinstance(msg, Decided):
            raise ValueError(f"unexpected downlink message in a decided session: {msg!r}")
        if msg.position != self.committed_end:
            raise ValueError(f"Decided at position {msg.position}, expected "
                             f"{self.committed_end}")
        stats = self.run.stats
        self._take_tokens(msg.tokens)
        stats.target_forwards = stats.rounds = self.run.passes_before + msg.passes
        if msg.counts is not None:
            stats.add_verifier(msg.counts)
            self.counted = True
        if msg.done:
            self.run.finished = True
