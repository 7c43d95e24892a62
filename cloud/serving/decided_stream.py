"""Decided sessions on the Session stream (docs/design.md §3): the verifier decides pass
after pass, applies the edge's Grow messages before each pass, and sends a Decided per pass.
The servicer (acespec.cloud.serving.servicer) owns the handler and lends it its stream I/O;
errors raised here end the call there, as the servicer's own do."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from acespec.cloud.errors import FailedPrecondition
from acespec.cloud.serving.deferred import WriteAtStart
from acespec.cloud.serving.metrics import RequestClock
from acespec.cloud.verify.decided import DecidedSession
from acespec.cloud.verify.engine import Engine
from acespec.proto import acespec_pb2 as pb
from acespec.proto.codec import (
    check_top_logprobs,
    decode_grow,
    decode_serve_params,
    encode_counts,
    encode_logprobs,
)
from acespec.shared.served import ServeParams

INBOX = 64  # uplink messages read ahead of the session loop; then the client is pushed back


def _ack(msg: pb.Decided, session: DecidedSession) -> None:
    """Stamp a Decided with the uplink messages applied so far and how long the last of
    them has been here (the decided sessions' counterpart of Scores.server_time)."""
    if session.acked:
        msg.acked = session.acked
        msg.held_us = min(2**32 - 1, round((time.perf_counter() - session.acked_at) * 1e6))


@dataclass
class DecidedStreams:
    """Serves the decided sessions of a servicer, through the servicer's stream I/O."""

    engine: Engine
    default_params: ServeParams
    write: Callable[[object, pb.Downlink], Awaitable[None]]  # (context, message), bounded
    read_ahead: Callable[[object, asyncio.Queue], Awaitable[None]]  # (context, inbox): fills
    # the inbox with (Uplink, arrival time), then EOF or the read's exception

    async def serve(self, msg: pb.Open, context, opened: list[str],
                    clock: RequestClock | None = None, client: str = "") -> None:
        """One decided session, from its Open to its end; its id goes to `opened`, its
        timeline to `clock`; client: whose (its passes share the client's part)."""
        clock = clock or RequestClock(None, "decided")
        session, opened_later = await self._open(msg, context, opened, client)
        clock.first_token()
        await self._loop(session, context, opened_later, clock, opened[0])

    async def _open(self, msg: pb.Open, context, opened: list[str], client: str
                    ) -> tuple[DecidedSession, pb.Downlink | None]:
        """Open the session and send its first token; the Opened still to send, when the
        edge asked for the first token ahead of it."""
        self.engine.check_handshake(msg.protocol_version, msg.vocab_hash)
        if not msg.vocab_hash:
            raise FailedPrecondition("Open.vocab_hash is required")
        params = decode_serve_params(msg.sampling, self.default_params)
        session_id, session, first = await self.engine.open_decided(
            list(msg.prompt_tokens), params, msg.seed, msg.decide.max_tokens,
            list(msg.decide.stop_tokens), gap=not msg.decide.no_gap,
            logprobs=check_top_logprobs(msg.decide.logprobs, msg.decide.top_logprobs,
                                        "Decide"), client=client)
        opened.append(session_id)
        if self.engine.metrics:
            self.engine.metrics.sessions_opened.inc()
        opened_msg = pb.Downlink(opened=pb.Opened(
            session_id=session_id, model_id=self.engine.model_id,
            vocab_hash=self.engine.vocab_hash, k_max=params.k_max,
            coupled=params.sampling.coupled, decides=True, gap=session.gap is not None))
        first_msg = pb.Downlink(decided=self._decided(session, session.prompt_len, first))
        if msg.decide.first_before_opened:  # the first token goes alone, Opened with the next
            await self.write(context, first_msg)
            return session, opened_msg
        await self.write(context, opened_msg)
        await self.write(context, first_msg)
        return session, None

    async def _loop(self, session: DecidedSession, context,
                    opened: pb.Downlink | None, clock: RequestClock, session_id: str) -> None:
        """The verifier decides (docs/design.md §3): pass after pass, never waiting for the link;
        Grow messages that arrived meanwhile are applied before each pass. Ends when the
        session is done (its last Decided carries the counts) or the edge half-closes.
        opened: the session's Opened, still to send (before the next Decided); clock: the
        call's timeline (acespec.cloud.serving.metrics); session_id: the engine's name for it."""
        inbox: asyncio.Queue = asyncio.Queue(INBOX)
        reader = asyncio.create_task(self.read_ahead(context, inbox))

        async def send(msg: pb.Decided) -> None:
            nonlocal opened
            if opened is not None:
                await self.write(context, opened)
                opened = None
            await self.write(context, pb.Downlink(decided=msg))

        try:
            if session.done and opened is not None:
                await self.write(context, opened)  # the first token was the last
            pending = None  # the last pass's Decided, sent while the next pass runs
            while not session.done:
                if self._apply_uplink(session, inbox):  # the edge has what it needs
                    clock.finish(session.end - session.prompt_len)  # before the last writes:
                    # an edge holding the last may cancel while a write still awaits
                    if pending is not None:
                        await send(pending)
                    await send(self._decided(session, session.end, [], last=True))
                    return
                drafts = session.counts.drafts_scored, session.counts.proposed_accepted
                start, new = await self._pass_while_sending(session, send, pending)
                self._count_drafts(session, *drafts)
                pending = self._decided(session, start, new)
                _ack(pending, session)
            clock.finish(session.end - session.prompt_len)
            if pending is not None:
                await send(pending)
            # Done: its KV and its place among the open sessions go now, not when the edge's
            # half-close arrives a round trip later (the stream lingers for it, holding nothing).
            self.engine.close(session_id)
            await self._until_half_close(inbox)
        finally:
            reader.cancel()

    async def _pass_while_sending(self, session: DecidedSession, send, pending
                                  ) -> tuple[int, list[int]]:
        """The session's next pass, queued before the last pass's Decided is written, and
        written once that pass has started (or the step ended first): a write waits for the
        event loop and the client's flow control, and a session that waited for it would
        come back too late for the pass after the one it was in (with many sessions, half
        of them would then take every other pass); written during the pass, it is not part
        of the turnaround between passes that leaves the device idle. The pass runs in this
        task: a session's turn between passes is one wakeup (its result, its decisions, its
        next request)."""
        if pending is None:
            return await self.engine.decided_pass(session)
        write = WriteAtStart(self.engine.batcher.next_start(), send, pending)
        try:
            result = await self.engine.decided_pass(session)
        except BaseException:
            write.cancel()
            raise
        await write.finish()
        return result

    def _count_drafts(self, session: DecidedSession, scored: int, proposed_taken: int
                      ) -> None:
        """The edge's drafts the last pass scored and those its walk took (the walk's
        nodes less the verifier's own proposals), from the counts before it."""
        if self.engine.metrics:
            c = session.counts
            self.engine.metrics.on_edge_drafts(
                c.drafts_scored - scored,
                len(session.walked) - (c.proposed_accepted - proposed_taken))

    @staticmethod
    async def _until_half_close(inbox: asyncio.Queue, linger_s: float = 10.0) -> None:
        """The session is done, but the edge may still be writing nodes it made before it
        read the last Decided: keep the stream open (drafts ignored) until it half-closes,
        so its writes never meet an ended stream (which it would take for a lost one)."""
        async def drain() -> None:
            while True:
                item = await inbox.get()
                msg = item[0] if isinstance(item, tuple) else item
                if msg is grpc.aio.EOF or isinstance(msg, Exception):
                    return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(drain(), linger_s)

    @staticmethod
    def _decided(session: DecidedSession, start: int, tokens: list[int], last: bool = False
                 ) -> pb.Decided:
        """What a pass decided, with the target's logprobs where the session asked; the
        session's last message (done, or `last`) carries the verifier's account of it."""
        msg = pb.Decided(position=start, tokens=tokens, passes=session.counts.passes)
        if session.logprobs is not None:  # (those of the last pass, when it sends its tokens)
            msg.logprobs.CopyFrom(encode_logprobs(session.last_logprobs if tokens else []))
        if session.done or last:
            msg.done = True
            msg.counts.CopyFrom(encode_counts(session.counts, time.perf_counter()))
        return msg

    def _apply_uplink(self, session: DecidedSession, inbox: asyncio.Queue) -> bool:
        """Apply queued uplink messages of a decided session, about the limits'
        applied_per_pass nodes per pass (what is left waits for the next one: a session that
        floods its uplink gets no more of the event loop per pass than one that does not);
        True at the edge's EOF. Each Grow's reach past the decided end goes to the metrics."""
        budget, metrics = session.limits.applied_per_pass, self.engine.metrics
        while not inbox.empty() and budget > 0:
            item = inbox.get_nowait()
            msg, arrived = item if isinstance(item, tuple) else (item, None)
            if isinstance(msg, Exception):
                raise msg
            if msg is grpc.aio.EOF:
                return True
            session.acked, session.acked_at = session.acked + 1, arrived
            kind = msg.WhichOneof("msg")
            if kind != "grow":
                raise FailedPrecondition(f"{kind or 'empty message'} in a session the verifier "
                                         "decides: send Grow")
            g = decode_grow(msg.grow, session.next_id)
            reach = session.apply_grow(g.anchor, g.parents, g.tokens)
            if metrics:
                metrics.on_grow(reach)
            budget -= len(g.tokens)
        return False
