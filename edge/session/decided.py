"""What the two decided drivers share (greedy and coupled acespec; docs/design.md §3).

The verifier decides every token, keeps decoding on its own through every round trip and
streams `Decided` tokens down; the edge streams drafts up (a chain: acespec.edge.session.chain;
a tree: acespec.edge.session.grow). This base reads the `Decided` stream: positions checked,
tokens handed to the driver's `take_tokens` and committed, the verifier's passes and final
account counted, an uplink write that fails after the verifier's last word tolerated. The
edge still holds the committed text (a verifier that dies loses nothing: its decisions are
deterministic, so a re-opened session decides the same).
"""

from __future__ import annotations

import asyncio
import time

import grpc

from acespec.edge.client import CloudSession, Decided
from acespec.edge.session.driver import get_within, unpack
from acespec.edge.session.runner import Runner


class DecidedDriver:
    """One connection attempt of a decided session. A subclass implements `work` (draft and
    send what is worth it now) and `take_tokens` (compare decided tokens with its drafts and
    commit them with runner.emit)."""

    def __init__(self, run: Runner, sess: CloudSession, inbox: asyncio.Queue):
        self.run, self.sess, self.inbox = run, sess, inbox
        self.counted = False  # the verifier's final account has arrived
        self.write_failed = False
        self.passes_before = run.stats.passes  # earlier attempts' passes
        self.sent: list[tuple[float, int]] = []  # (time, bytes) of each uplink message
        self.acked = 0  # of those, how many the verifier said it applied
        self.applied = 0  # acked as of the Decided being applied (0 before any)
        # The verifier consumes drafts as fast as its passes run, and a chain that is short
        # of a round trip's worth leaves it decoding alone: the adaptive shape drafts up to
        # the widest window (dead drafts cost only uplink bytes, never a pass).
        cfg = run.cfg
        self.depth = cfg.depth if cfg.adaptive else run.shape.depth
        self.window = cfg.max_window if cfg.adaptive else run.shape.window

    async def work(self) -> bool:
        """Draft and send what is worth it now; False when only the downlink can help."""
        raise NotImplementedError

    def take_tokens(self, tokens: list[int]) -> None:
        """Decided tokens at the committed end: judge the drafts, commit the tokens."""
        raise NotImplementedError

    async def drive(self) -> None:
        run, inbox = self.run, self.inbox
        while not run.finished:
            # Take what the reader has handed over, so a verifier that decides faster than
            # the edge drafts is followed, not raced.
            await asyncio.sleep(0)
            while not inbox.empty() and not run.finished:
                self._take(inbox.get_nowait())
            if run.finished:
                break
            if self.write_failed:
                await self._finish_after_failed_write()
                break
            if await self.work():
                continue
            self._take(await inbox.get())
        if not self.counted:
            await self._final_counts()

    async def guarded(self, write) -> None:
        """Await an uplink write. A verifier older than the linger of the session's end
        may have ended the stream after its last Decided while we were drafting: the write
        then fails, but the tokens are in the inbox; only without them is it a loss."""
        t0, before = time.perf_counter(), self.sess.bytes_up
        try:
            await write
        except (grpc.aio.AioRpcError, ConnectionError):
            self.write_failed = True
        self.sent.append((t0, self.sess.bytes_up - before))

    async def _finish_after_failed_write(self) -> None:
        """Read what the verifier sent before the stream ended; lost if it is not the end."""
        while not self.run.finished:
            self._take(await get_within(self.inbox, 5.0))

    async def _final_counts(self, timeout_s: float = 2.0) -> None:
        """The edge finished first (max_tokens or a stop it saw first): half-close; the
        verifier answers with its account of the session. Not worth waiting long for."""
        await self.sess.done_writing()
        try:
            await asyncio.wait_for(self._await_counts(), timeout_s)
        except asyncio.TimeoutError:
            return

    async def _await_counts(self) -> None:
        while not self.counted:
            msg = await self.inbox.get()
            msg = msg[0] if isinstance(msg, tuple) else msg
            if isinstance(msg, Exception):
                return
            if isinstance(msg, Decided) and msg.counts is not None:
                self.run.stats.add_verifier(msg.counts)
                self.counted = True

    def _observe_link(self, msg: Decided, size: int, arrived: float) -> None:
        """A Decided that acknowledges a new uplink message is that message's round trip:
        sent -> applied and answered, of which held_s was the verifier's (as an Extend's
        Scores in exact sessions). It feeds the link estimate the tree's budgets follow."""
        if not self.acked < msg.acked <= len(self.sent):
            return
        self.acked = msg.acked
        sent_at, up = self.sent[msg.acked - 1]
        self.run.link.observe(up, size, arrived - sent_at, msg.held_s, arrived)
        if self.run.link.ready:
            self.run.note_link(**self.link_figures())

    def link_figures(self) -> dict:
        """What a driver derives from the link estimate, for the stats (none here)."""
        return {}

    def _take(self, item) -> None:
        """Apply one downlink message (or raise the reader's error)."""
        msg, size, _, arrived = unpack(item)
        if not isinstance(msg, Decided):
            raise ValueError(f"unexpected downlink message in a decided session: {msg!r}")
        if msg.position != self.run.committed_end:
            raise ValueError(f"Decided at position {msg.position}, expected "
                             f"{self.run.committed_end}")
        self._observe_link(msg, size, arrived)
        stats = self.run.stats
        self.applied = msg.acked  # what the verifier held when it decided these tokens
        if msg.logprobs is not None:
            self.run.expect_logprobs(msg.position, msg.logprobs)
        self.take_tokens(msg.tokens)
        stats.passes = stats.rounds = self.passes_before + msg.passes
        if msg.counts is not None:
            stats.add_verifier(msg.counts)
            self.counted = True
        if msg.done:
            self.run.finished = True
