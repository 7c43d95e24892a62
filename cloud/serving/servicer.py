"""The gRPC boundary: protobuf in, engine calls, protobuf out; domain errors become status
codes here and end only the session that caused them. Edge-decided sessions and Generate
are served here; decided sessions by the handler the servicer owns
(acespec.cloud.serving.decided_stream)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import re
import time

import grpc
from google.protobuf.message import DecodeError

from acespec.cloud.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    SessionError,
    Unauthenticated,
    Unavailable,
)
from acespec.cloud.serving.decided_stream import INBOX, DecidedStreams
from acespec.cloud.serving.deferred import WriteAtStart
from acespec.cloud.serving.metrics import RequestClock
from acespec.cloud.verify.engine import Engine
from acespec.proto import CLIENT_KEY
from acespec.proto import acespec_pb2 as pb
from acespec.proto import acespec_pb2_grpc as pb_grpc
from acespec.proto.codec import (
    WireError,
    check_more_tail,
    check_top_logprobs,
    decode_extend,
    decode_serve_params,
    encode_logprobs,
    encode_scores,
)
from acespec.shared.served import ServeParams

try:  # a failed core batch: the call is gone (client cancel, dropped connection, stop)
    from grpc._cython.cygrpc import ExecuteBatchError
except ImportError:  # pragma: no cover - other gRPC builds: nothing to recognise
    ExecuteBatchError = ()

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_.:\[\]-]")
REFUSE_WAIT_S = 2.0  # a refused session's first message is waited for this long at most


def client_of(md: dict, peer: str, keyed: bool) -> str:
    """Whose call this is: the sessions of one client share its part of a pass
    (acespec.cloud.verify.clients). The bearer token where the verifier asks for one (a
    client cannot choose another's), shown as a hash; else the id the edge sends in
    metadata x-acespec-client (an edge serving many requests is one client, also behind a
    proxy that pools connections); else the connection's peer."""
    if keyed:
        token = md.get("authorization", "")[7:]
        return "key:" + hashlib.sha256(token.encode()).hexdigest()[:12]
    if edge := md.get(CLIENT_KEY):
        return "edge:" + _SAFE.sub("_", edge[:32])
    return "peer:" + _SAFE.sub("_", (peer or "unknown")[:64])


class ClientGone(Exception):
    """The client cancelled or dropped the call: end quietly, no status, no error metric."""


def _coalescible(msg) -> bool:
    """An Extend that may join the previous one's forward pass (a commit must wait: it may
    name a node that pass has not scored yet)."""
    return (not isinstance(msg, Exception) and msg is not grpc.aio.EOF
            and msg.WhichOneof("msg") == "extend" and not msg.extend.HasField("commit"))


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(self, engine: Engine, auth_tokens: frozenset[str] = frozenset(),
                 idle_timeout_s: float = 300.0, default_params: ServeParams = ServeParams(),
                 write_timeout_s: float = 30.0):
        self.engine, self.auth_tokens = engine, auth_tokens
        self.idle_timeout_s, self.default_params = idle_timeout_s, default_params
        self.write_timeout_s = write_timeout_s
        self._last_io: dict[int, float] = {}  # id(context) -> last message either way
        self.lost: str | None = None  # why no pass can run any more (fail_all)
        self.draining = False  # the server is stopping: sessions get its grace period
        self._lost: asyncio.Future | None = None  # done with that reason
        self.decided = DecidedStreams(engine, default_params, self._write, self._read_ahead)
        if engine.metrics:
            engine.metrics.watch(engine)

    def fail_all(self, reason: str) -> None:
        """No pass can run any more (a tensor-parallel rank was lost): sessions waiting for
        their client, and every call from now on, end with UNAVAILABLE and `reason` (those
        in a pass get it from the pass)."""
        self.lost = reason
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(reason)

    def _lost_future(self) -> asyncio.Future:
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
            if self.lost:
                self._lost.set_result(self.lost)
        return self._lost

    # -- boundary helpers ---------------------------------------------------------

    def _authorize(self, context) -> str:
        """The caller's client identity (client_of), once its token is checked."""
        md = dict(context.invocation_metadata() or ())
        if self.auth_tokens:
            header = md.get("authorization", "")
            if not header.startswith("Bearer ") or header[7:] not in self.auth_tokens:
                raise Unauthenticated("missing or wrong bearer token (metadata "
                                      "'authorization: Bearer <token>')")
        return client_of(md, context.peer(), bool(self.auth_tokens))

    @staticmethod
    async def _first_message(context) -> None:
        """Let a refused session's first message arrive (REFUSE_WAIT_S at most) before the
        refusal goes out: a status sent while the client's first write is still in flight
        reaches a grpc.aio client as INTERNAL, 'Internal error from Core' (grpc/grpc#36066),
        not as the refusal it is."""
        read = asyncio.ensure_future(context.read())
        done, _ = await asyncio.wait({read}, timeout=REFUSE_WAIT_S)
        if not done:
            read.cancel()
        elif not read.cancelled():
            read.exception()  # taken: a message that did not parse changes nothing here

    async def _fail(self, context, err: Exception, what: str) -> None:
        """End the call with err's status code. A client that went away gets no status:
        raises CancelledError, which gRPC takes as a cancelled call (nothing logged)."""
        if isinstance(err, ClientGone):
            log.info("%s: the client went away", what)
            raise asyncio.CancelledError
        if isinstance(err, WireError):
            err = InvalidArgument(str(err))
        if not isinstance(err, SessionError):
            log.exception("internal error", exc_info=err)
            err = SessionError("internal error (see the verifier's log)")
        if self.engine.metrics:
            self.engine.metrics.errors.labels(err.code).inc()
        log.info("%s ended: %s %s", what, err.code, err)
        try:  # waits while the client does not read: the status queues behind the data
            await context.abort(grpc.StatusCode[err.code], str(err))
        except ExecuteBatchError:
            log.info("%s: the client went away before taking its status", what)
            raise asyncio.CancelledError from None

    def _count(self, direction: str, msg) -> None:
        if self.engine.metrics:
            self.engine.metrics.on_message(direction, msg.ByteSize())

    async def _read(self, context):
        """The next uplink message. A session is idle when nothing crossed the stream either
        way for idle_timeout_s: one the verifier is decoding on its own is not."""
        read = asyncio.ensure_future(context.read())  # waited on, not cancelled, while live
        lost = self._lost_future()
        try:
            while not read.done():
                if lost.done():
                    raise Unavailable(lost.result())
                last = self._last_io.setdefault(id(context), time.monotonic())
                left = last + self.idle_timeout_s - time.monotonic()
                if left <= 0:
                    raise DeadlineExceeded(f"session idle for more than {self.idle_timeout_s:g}"
                                           " s (--idle-timeout: no message either way); its "
                                           "KV was freed")
                await asyncio.wait({read, lost}, timeout=left,
                                   return_when=asyncio.FIRST_COMPLETED)
            msg = read.result()
        except DecodeError as e:
            raise InvalidArgument(f"malformed Uplink message: {e}") from None
        except ExecuteBatchError:
            raise ClientGone from None
        finally:
            read.cancel()  # a no-op once it is done
        self._last_io[id(context)] = time.monotonic()
        if msg is not grpc.aio.EOF:
            self._count("up", msg)
        return msg

    async def _write(self, context, msg) -> None:
        """Send one message; a client that stops reading blocks this once its flow-control
        window is full, and the idle timeout (a read timeout) no longer applies: bound it."""
        self._count("down", msg)
        self._last_io[id(context)] = time.monotonic()
        try:
            await _within(context.write(msg), self.write_timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"the client read nothing for {self.write_timeout_s:g} s "
                                   "while the downlink was full (--write-timeout); the call "
                                   "was ended and its KV freed") from None
        except ExecuteBatchError:
            raise ClientGone from None

    # -- Session ------------------------------------------------------------------

    async def Session(self, request_iterator, context):  # noqa: N802 - gRPC name
        opened: list[str] = []  # the session id, once open
        try:
            await self._session(context, opened)
        except asyncio.CancelledError:
            name = opened[0] if opened else "(unopened)"
            if self.draining:  # the server's stop cancels what outlived the grace period:
                log.warning("session %s cut: the shutdown's grace period ended", name)
                return  # an end foreseen, not an error for gRPC to log as one
            log.info("session %s cancelled by the client", name)
            raise
        except Exception as e:  # noqa: BLE001 - domain errors keep their code; others INTERNAL
            self._close(opened)  # first: a client that does not read may never take the status
            await self._fail(context, e, f"session {opened[0] if opened else '(unopened)'}")
        finally:
            self._close(opened)
            self._last_io.pop(id(context), None)

    def _close(self, opened: list[str]) -> None:
        self.engine.close(opened[0] if opened else None)

    async def _session(self, context, opened: list[str]) -> None:
        try:
            client = self._authorize(context)
        except Unauthenticated:
            await self._first_message(context)
            raise
        first = await self._read(context)
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("msg") != "open":
            raise FailedPrecondition(f"{first.WhichOneof('msg') or 'empty message'} "
                                     "before Open: the first message must be Open")
        prompt = len(first.open.prompt_tokens)
        if first.open.HasField("decide"):
            clock = RequestClock(self.engine.metrics, "decided", prompt)
            await self.decided.serve(first.open, context, opened, clock, client)
            return
        clock = RequestClock(self.engine.metrics, "edge_decided", prompt)
        session = await self._open(first.open, context, opened, client)
        clock.first_token()  # the root's distribution: the edge may sample it
        await self._loop(session, context)
        clock.finish(session.share.total_accepted)  # its committed tokens

    async def _open(self, msg: pb.Open, context, opened: list[str], client: str):
        self.engine.check_handshake(msg.protocol_version, msg.vocab_hash)
        if not msg.vocab_hash:
            raise FailedPrecondition("Open.vocab_hash is required")
        params = decode_serve_params(msg.sampling, self.default_params)
        res = await self.engine.open(list(msg.prompt_tokens), params, msg.seed,
                                     msg.limits.max_live_nodes, client)
        opened.append(res.session_id)
        if self.engine.metrics:
            self.engine.metrics.sessions_opened.inc()
        await self._write(context, pb.Downlink(opened=pb.Opened(
            session_id=res.session_id, model_id=self.engine.model_id,
            vocab_hash=self.engine.vocab_hash, max_live_nodes=res.max_live_nodes,
            k_max=params.k_max, root=encode_scores([res.root], params.sampling.decided),
            coupled=params.sampling.coupled)))
        return res.session

    async def _loop(self, session, context) -> None:
        """Process the stream in order. A reader runs ahead, so Extends that queue up while
        the target is busy are scored together in one forward pass (one Scores each)."""
        inbox: asyncio.Queue = asyncio.Queue(INBOX)  # bounded: a client that writes while
        # it never reads must not fill the server's memory while _write waits
        reader = asyncio.create_task(self._read_ahead(context, inbox))
        held = None
        try:
            while True:
                item, held = (held, None) if held is not None else (await inbox.get(), None)
                msg, arrived = item if isinstance(item, tuple) else (item, None)
                if isinstance(msg, Exception):
                    raise msg
                if msg is grpc.aio.EOF:
                    return
                kind = msg.WhichOneof("msg")
                if kind == "extend":
                    group = [(msg, arrived)]
                    while not inbox.empty() and held is None:
                        nxt = inbox.get_nowait()
                        if isinstance(nxt, tuple) and _coalescible(nxt[0]):
                            group.append(nxt)
                        else:
                            held = nxt
                    await self._extend(session, group, context)
                elif kind == "commit":
                    self._commit(session, msg.commit.node_id)
                elif kind == "more_tail":
                    node_id, n = check_more_tail(msg.more_tail)
                    ids, units = session.more_tail(node_id, n)
                    await self._write(context, pb.Downlink(tail=pb.TailSamples(
                        node_id=node_id, tail_token=ids.tolist(), tail_token_p=units.tolist())))
                elif kind == "open":
                    raise FailedPrecondition("second Open on one stream; open a new stream")
                elif kind == "grow":
                    raise FailedPrecondition("Grow in an edge-decided session: it needs a "
                                             "session opened with Open.decide; send Extend")
                else:
                    raise InvalidArgument("empty Uplink message (no field of the oneof is set)")
        finally:
            reader.cancel()

    def _commit(self, session, node_id: int) -> None:
        """Re-root an edge-decided session at node_id; the nodes it commits were taken."""
        before = session.share.total_accepted
        session.commit(node_id)
        if self.engine.metrics:
            self.engine.metrics.on_edge_drafts(0, session.share.total_accepted - before)

    async def _read_ahead(self, context, inbox: asyncio.Queue) -> None:
        while True:
            try:
                msg = await self._read(context)
            except Exception as e:  # noqa: BLE001 - raised in order by the loop
                await inbox.put(e)
                return
            await inbox.put((msg, time.perf_counter()))
            if msg is grpc.aio.EOF:
                return

    async def _extend(self, session, group: list, context) -> None:
        """group: [(Uplink with an Extend, arrival time)] scored in one pass, one Scores each
        (stamped with the time each Extend spent here)."""
        first = group[0][0].extend
        if first.HasField("commit"):
            self._commit(session, first.commit)
        batches, next_id = [], session.next_id
        for m, _ in group:
            nodes = decode_extend(m.extend, next_id)
            batches.append((nodes.first_id, nodes.tokens, nodes.parents))
            next_id += len(nodes.tokens)
        greedy = session.params.sampling.decided  # one decided id per node
        scored = await self.engine.extend_many(session, batches)
        if self.engine.metrics:
            self.engine.metrics.on_edge_drafts(sum(len(t) for _, t, _ in batches), 0)
        for scores, (_, arrived) in zip(scored, group):
            msg = encode_scores(scores, greedy)
            msg.server_time = min(2**32 - 1, round((time.perf_counter() - arrived) * 1e4))
            await self._write(context, pb.Downlink(scores=msg))

    # -- Generate -------------------------------------------------------------------

    async def _stream(self, context, tokens, clock: RequestClock) -> int:
        """Write each generated token as a chunk; returns how many. A token's chunk is
        written once the pass after it has started (WriteAtStart): the next token's request
        is queued first, so the write is no part of the turnaround between passes."""
        count, pending = 0, None
        try:
            async with contextlib.aclosing(tokens):
                async for out in tokens:
                    count += 1
                    chunk = pb.GenerateChunk(tokens=[out.token], passes=count)
                    if out.logprob is not None:
                        chunk.logprobs.CopyFrom(encode_logprobs([out.logprob]))
                    clock.first_token()
                    if pending is not None:
                        await pending.finish()
                        pending = None
                    if out.last:
                        clock.finish(count)  # before its write: a client holding the last
                        # token may cancel while the write still awaits
                        await self._write(context, chunk)
                    else:
                        pending = WriteAtStart(self.engine.batcher.next_start(),
                                               functools.partial(self._write, context), chunk)
        finally:
            if pending is not None:
                pending.cancel()
        return count

    async def _prompt_logprobs(self, request, context, client: str) -> bool:
        """The first chunk: the prompt's logprobs. True when that is all that was asked
        (max_tokens 0): the call is then done."""
        top = check_top_logprobs(True, request.top_logprobs, "GenerateRequest")
        entries = await self.engine.prompt_logprobs(list(request.prompt_tokens), top, client)
        only = request.max_tokens == 0
        chunk = pb.GenerateChunk(done=only, passes=1)
        chunk.prompt_logprobs.CopyFrom(encode_logprobs(entries))
        await self._write(context, chunk)
        return only

    async def Generate(self, request, context):  # noqa: N802 - gRPC name
        """Written with context.write (not yielded) so the write timeout applies and a
        client's cancel unwinds through `aclosing`: the engine stops scoring at once."""
        try:
            client = self._authorize(context)
            if self.lost:
                raise Unavailable(self.lost)
            self._count("up", request)
            clock = RequestClock(self.engine.metrics, "generate", len(request.prompt_tokens))
            self.engine.check_handshake(request.protocol_version, request.vocab_hash)
            params = decode_serve_params(request.sampling, self.default_params)
            asked = check_top_logprobs(request.logprobs, request.top_logprobs,
                                       "GenerateRequest")
            if request.prompt_logprobs:
                if await self._prompt_logprobs(request, context, client):
                    clock.finish(0)
                    return
            tokens = self.engine.generate(list(request.prompt_tokens), params, request.seed,
                                          request.max_tokens, list(request.stop_tokens),
                                          asked, client)
            count = await self._stream(context, tokens, clock)
            clock.finish(count)
            await self._write(context, pb.GenerateChunk(done=True, passes=count))
        except asyncio.CancelledError:
            if self.draining:
                log.warning("Generate cut: the shutdown's grace period ended")
                return
            log.info("Generate cancelled by the client")
            raise
        except Exception as e:  # noqa: BLE001 - domain errors keep their code; others INTERNAL
            await self._fail(context, e, "Generate")
        finally:
            self._last_io.pop(id(context), None)


async def _within(aw, seconds: float):
    """await aw for at most `seconds` (asyncio.TimeoutError past them): with
    asyncio.timeout where there is one (Python 3.11), which wraps no task around it, as
    wait_for does on each of the verifier's writes."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await aw
    return await asyncio.wait_for(aw, seconds)
