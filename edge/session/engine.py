"""The edge engine: one request decoded against a remote verifier, in any mode.

A mode (EngineConfig.mode, a row of acespec.shared.modes) picks the wire protocol and its
driver:

* nobody drafts (ar)                       -> `Generate`, ArDriver
* the verifier decides (acespec and its variants, greedy or coupled; the rivals colo and
  cloud-lookup)                            -> `Grow`/`Decided`: GrowDriver streams the
  speculation tree (a chain where the mode has no branches); NoDraftDriver where the edge
  drafts nothing
* the edge decides (sd, pipeline, acespec-exact, and every mode with exact sampling or
  against a verifier that cannot decide) -> `Extend`/`Scores`, EdgeDecidedDriver

All modes sample p~ exactly; greedy gives the same text in every mode. The Runner holds the
committed text across connection attempts: if the verifier goes away, the engine reconnects
with backoff and re-opens the session with the committed tokens, losing and duplicating
nothing. A deadline (EngineConfig.reconnect_deadline_s, or connect_timeout_s before any
session opened) bounds the whole outage: each attempt must connect, and re-open, within
what is left of it, so a verifier that accepts connections but never answers (stopped,
wedged, a black hole) costs no more than one that refuses them. While the link is down the
request waits, or answers from the drafter, unverified (EngineConfig.offline;
acespec.edge.session.offline); a session silent too long counts as down too.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import grpc

from acespec.edge.client import CloudSession
from acespec.edge.session.ar import ArDriver
from acespec.edge.session.config import GROW_SEQS, EngineConfig, Stats
from acespec.edge.session.driver import Driver, Lost, read_downlink
from acespec.edge.session.edge_decided import EdgeDecidedDriver
from acespec.edge.session.grow import GrowDriver
from acespec.edge.session.no_draft import NoDraftDriver
from acespec.edge.session.offline import OnEvent
from acespec.edge.session.runner import OnTokens, Runner

log = logging.getLogger(__name__)

LAST_TRY_S = 0.25  # the least time left in a deadline worth another attempt
STALL_WAITS = 4  # a session stalls at this many times its usual wait for the verifier, or more


class EdgeEngine:
    def __init__(self, connect: Callable[[], grpc.aio.Channel], vocab_hash: str,
                 drafter=None, token: str | None = None, owns_channels: bool = True):
        """connect() gives a channel per session attempt; with owns_channels=False it may
        return one shared channel, which the engine then never closes."""
        self.connect, self.vocab_hash, self.drafter, self.token = connect, vocab_hash, drafter, token
        self.owns_channels = owns_channels
        self.client_id = uuid.uuid4().hex[:16]  # the verifier groups this edge's sessions

    async def generate(self, prompt: Sequence[int], cfg: EngineConfig,
                       on_tokens: OnTokens | None = None,
                       seq: int = 0, branch_seq: int | Sequence[int] | None = None,
                       on_event: OnEvent | None = None) -> tuple[list[int], Stats]:
        """Decode up to cfg.max_tokens after `prompt`; returns (tokens, stats). on_tokens is
        called with each newly committed token (and the running stats). `seq` is the
        drafter sequence this request may use (one per concurrent request); acespec mode
        builds its branches on `branch_seq` (default seq + 1..seq + 6; a list gives several),
        which no other request may use. on_event gets the link's events (down, up) and, in
        local offline mode, the unverified tokens and how they were settled
        (acespec.edge.session.offline); returned tokens are verified ones only, and
        stats.unverified_tail holds what stayed unverified if the verifier never came back.
        Raises ConnectionError when the verifier cannot be reached (soon, if it never was),
        grpc.aio.AioRpcError when it refuses, GrantTooSmall when its grant is too small."""
        if cfg.spec.edge_drafts and self.drafter is None:
            raise ValueError(f"mode {cfg.mode!r} needs a drafter")
        if cfg.serve.sampling.shaped:  # where the output (what penalties, grammars count) starts
            cfg = _output_from(cfg, len(prompt))
        if branch_seq is None:  # as many as the drafter has, up to GROW_SEQS
            limit = getattr(getattr(self.drafter, "config", None), "n_seq_max", seq + 7)
            branch_seq = list(range(seq + 1, min(seq + 1 + GROW_SEQS, limit))) or [seq + 1]
        run = Runner(self.drafter, list(prompt), cfg, on_tokens, seq,
                     [branch_seq] if isinstance(branch_seq, int) else list(branch_seq),
                     on_event)
        retry = Reconnect(cfg)
        try:
            while not run.finished:
                try:
                    await self._attempt(run, retry.until(run))
                except (grpc.aio.AioRpcError, ConnectionError) as e:  # Lost is a ConnectionError
                    if _retriable(e):
                        run.offline.down(_reason(e))
                    try:
                        await retry.wait(e, run)
                    except ConnectionError:
                        if not run.offline.local:
                            raise
                        await self._end_unverified(run, e)
                        break
            run.announce(run.settle_all())
        finally:
            await run.offline.close()
        run.stats.seconds = time.perf_counter() - run.t0
        return run.out, run.stats

    @staticmethod
    async def _end_unverified(run: Runner, e: ConnectionError) -> None:
        """Local mode, the verifier gone past the deadline: the answer ends on the drafter's
        text, which stays unverified (stats.unverified_tail)."""
        await run.offline.finish_locally()
        run.stats.unverified_tail = list(run.unverified)
        log.warning("%s; the answer ends with %d unverified tokens", e, len(run.unverified))
        run.finished = True

    async def _attempt(self, run: Runner, until: float | None) -> None:
        """One connection attempt: a channel, a session in the mode's protocol, its driver.
        until (perf_counter): the channel must connect by then, and in an outage the
        session re-open by then, or ConnectionError."""
        ch = self.connect()
        watch = Watch(run)
        try:
            if until is not None:
                await watch.over(_connected_by(ch, until))
            # The first open may prefill a long prompt: only a re-open is bounded.
            reopen_by = until if run.connected else None
            if run.cfg.spec.cloud_only:
                passes = run.stats.passes  # a token streamed: the verifier answers
                await _by(ArDriver(run, ch, self.vocab_hash, self.token, self.client_id).drive(), reopen_by,
                          lambda: run.stats.passes > passes)
            else:
                await watch.over(self._stream(run, CloudSession(ch, self.token, client=self.client_id), reopen_by,
                                              watch))
        finally:
            if self.owns_channels:
                await ch.close()

    async def _stream(self, run: Runner, sess: CloudSession, until: float | None,
                      watch: Watch) -> None:
        run.attach(sess)
        watch.sess = sess
        inbox: asyncio.Queue = asyncio.Queue()
        reader = None
        try:
            driver = await _by(self._open(run, sess, inbox), until)
            run.connected = watch.opened = True
            await run.offline.up()
            reader = asyncio.create_task(read_downlink(sess, inbox))
            await driver.drive()
            await sess.close()
        finally:
            if reader:
                reader.cancel()
            if not run.finished:
                sess.cancel()  # an error or a cancelled request: the verifier frees the KV
            run.detach()

    async def _open(self, run: Runner, sess: CloudSession, inbox: asyncio.Queue) -> Driver:
        """Open the session and pick its driver: the verifier decides where the mode and
        the sampling let it (a verifier that cannot decide answers with a root score)."""
        cfg = run.cfg
        if cfg.decided:
            root = await sess.open_decided(run.context, cfg.serve, cfg.seed, self.vocab_hash,
                                           cfg.max_tokens - len(run.out), sorted(cfg.stop_ids),
                                           gap=cfg.spec.gap, logprobs=cfg.logprobs)
            if root is None:
                return (GrowDriver if cfg.spec.edge_drafts else NoDraftDriver)(run, sess, inbox)
        else:
            # Commits ride on the next Extend, so the verifier frees dead and committed
            # nodes one Extend later than the edge does: it may hold up to twice the window.
            root = await sess.open(run.context, cfg.serve, cfg.seed, self.vocab_hash,
                                   max_live_nodes=EdgeDecidedDriver.live_limit(cfg))
        return EdgeDecidedDriver(run, sess, inbox, root)


class Watch:
    """Stall detection for one connection attempt: the link counts as down once the attempt
    has owed an answer for the offline stall threshold with none heard (connecting: since
    it began; then since the last message, or the first one up). A verifier that is slow to
    answer anyway (a busy one) is given STALL_WAITS times its usual wait. An opened
    session that stalls is abandoned (Lost) and a new one dialled; one still opening is
    let be (it may be prefilling a long prompt), though local mode answers meanwhile."""

    def __init__(self, run: Runner):
        self.run, self.t0 = run, time.perf_counter()
        self.sess: CloudSession | None = None
        self.opened = False

    def quiet_s(self) -> float:
        """Seconds the attempt has owed an answer with none heard (0: nothing owed)."""
        if self.sess is None:
            return time.perf_counter() - self.t0
        since = self.sess.owed_since
        return 0.0 if since is None else time.perf_counter() - since

    def stall_s(self) -> float:
        usual = self.sess.wait_s if self.sess is not None else 0.0
        return max(self.run.offline.stall_s, STALL_WAITS * usual)

    async def over(self, aw: Awaitable):
        """aw's result, watched; Lost if it stalls once opened."""
        task = asyncio.ensure_future(aw)
        try:
            while True:
                stall, quiet = self.stall_s(), self.quiet_s()
                if quiet >= stall:
                    reason = f"no word from the verifier for {quiet:.1f} s"
                    self.run.offline.down(reason, stalled=True)
                    if self.opened:
                        raise Lost(reason)
                    quiet = 0.0  # told once; look again a threshold later
                done, _ = await asyncio.wait({task}, timeout=stall - quiet)
                if task in done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # let it unwind (close its session)


def _output_from(cfg: EngineConfig, position: int) -> EngineConfig:
    sampling = replace(cfg.serve.sampling, output_from=position)
    return replace(cfg, serve=replace(cfg.serve, sampling=sampling))


def _reason(e: Exception) -> str:
    """One line for a failed call (an AioRpcError's str() is a multi-line debug dump; a Lost
    session carries the gRPC error that lost it as its cause)."""
    if not isinstance(e, grpc.aio.AioRpcError) and isinstance(e.__cause__, grpc.aio.AioRpcError):
        e = e.__cause__
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return str(e)


def _refused(e: Exception) -> bool:
    """The verifier's address answered no (refused, reset, no such host), as opposed to a
    connection that got no answer at all (gRPC's own connect timeout included)."""
    return isinstance(e, grpc.aio.AioRpcError) and "timed out" not in (e.details() or "")


def _retriable(e: Exception) -> bool:
    """A lost connection is worth a new session; a refusal (bad request, auth, vocabulary,
    an unusable token in the metadata) would only be refused again."""
    if not isinstance(e, grpc.aio.AioRpcError):
        return True
    if "metadata" in (e.details() or "").lower():
        return False
    return e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


class Reconnect:
    """The resume policy of one request: exponential backoff for a connection that worked
    (the committed text is kept), but a quick, clear failure when no session ever opened
    and the address refuses: a wrong address or a verifier that is down should not take
    half a minute to report. A deadline is a bound on the whole outage, attempts included
    (see `until`)."""

    def __init__(self, cfg: EngineConfig):
        self.cfg, self.t0 = cfg, time.perf_counter()
        self.delay, self.failures, self.progress = cfg.backoff_s, 0, 0
        self.outage_t0: float | None = None  # when the current outage began

    def until(self, run: Runner) -> float | None:
        """When (perf_counter) the request gives up if no verifier answers: before any
        session opened, the reconnect deadline (or connect_timeout_s without one) after the
        request began; then the reconnect deadline after the outage began; None: no
        deadline (max_reconnects counts attempts instead). A refusal before any session
        opened gives up sooner (`wait`)."""
        if not run.connected:
            return self.t0 + (self.cfg.reconnect_deadline_s or self.cfg.connect_timeout_s)
        if self.outage_t0 is None or self.cfg.reconnect_deadline_s is None:
            return None
        return self.outage_t0 + self.cfg.reconnect_deadline_s

    async def wait(self, e: Exception, run: Runner) -> None:
        """Sleep before the next attempt, or raise when the request should fail now."""
        if not _retriable(e):
            raise e
        cfg, now = self.cfg, time.perf_counter()
        if len(run.out) > self.progress:  # the last session got somewhere: a new outage
            self.delay, self.failures, self.progress = cfg.backoff_s, 0, len(run.out)
        if self.failures == 0:
            self.outage_t0 = now
        until = self.until(run)
        if not run.connected and not run.offline.local and _refused(e):
            # Refused (or no such host) before any session opened: most likely no verifier
            # there, and a typo should not take the whole deadline to report. A link that
            # gives no answer at all may be down for now: that is waited out.
            until = min(until, self.t0 + cfg.connect_timeout_s)
        if until is not None and until - now < LAST_TRY_S:
            if not run.connected:
                raise ConnectionError(f"no connection within {until - self.t0:.3g} s "
                                      f"({_reason(e)})") from e
            raise ConnectionError(f"verifier unreachable for {cfg.reconnect_deadline_s:g} s "
                                  f"(reconnect deadline; {_reason(e)})") from e
        if cfg.reconnect_deadline_s is None and self.failures >= cfg.max_reconnects:
            raise ConnectionError(f"verifier unreachable after {cfg.max_reconnects} "
                                  f"reconnects ({_reason(e)})") from e
        # The last attempt comes at the deadline, with LAST_TRY_S to connect in.
        delay = self.delay if until is None else min(self.delay, until - now - LAST_TRY_S)
        self.failures += 1
        run.stats.reconnects += 1
        # Before any session opened this is not an outage yet, only a slow start: no warning.
        log.log(logging.WARNING if run.connected else logging.INFO,
                "verifier connection lost (%s); reconnecting in %.2f s with %d committed "
                "tokens", _reason(e), delay, len(run.out))
        await asyncio.sleep(delay)
        self.delay = min(self.delay * 2, 8.0 if cfg.reconnect_deadline_s is None else 2.0)


async def _connected_by(ch: grpc.aio.Channel, until: float) -> None:
    """Return once the channel is connected, or has failed to (the call made on it next then
    fails at once, with gRPC's reason); ConnectionError if it is still connecting at
    `until` (perf_counter)."""
    t0 = time.perf_counter()
    state = ch.get_state(try_to_connect=True)
    while state in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING):
        change = asyncio.ensure_future(ch.wait_for_state_change(state))
        try:
            await asyncio.wait({change}, timeout=max(until - time.perf_counter(), 0))
        finally:
            change.cancel()  # a no-op once it is done
        if not change.done() or change.cancelled():
            raise ConnectionError("the verifier did not answer the connection within "
                                  f"{until - t0:.1f} s")
        state = ch.get_state(try_to_connect=True)


async def _by(aw: Awaitable, until: float | None,
              answered: Callable[[], bool] | None = None):
    """aw's result; if it is still running at `until` (perf_counter; None: no bound) and
    answered() is false, it is cancelled and ConnectionError raised. Unlike
    asyncio.wait_for on Python 3.10/3.11, a cancellation of the caller is never lost."""
    if until is None:
        return await aw
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({task}, timeout=max(until - time.perf_counter(), 0))
        if not task.done() and not (answered and answered()):
            task.cancel()
            await asyncio.wait({task})  # let it unwind
            raise ConnectionError("the verifier did not answer the re-opened session in time")
        return await task
    finally:
        task.cancel()  # the caller was cancelled (a no-op once it is done)
