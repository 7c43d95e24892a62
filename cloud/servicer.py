"""The gRPC boundary: protobuf in, engine calls, protobuf out; domain errors become status
codes here and end only the session that caused them."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf.message import DecodeError

from acespec.cloud.engine import Engine
from acespec.cloud.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    SessionError,
    Unauthenticated,
)
from acespec.proto import acespec_pb2 as pb
from acespec.proto import acespec_pb2_grpc as pb_grpc
from acespec.proto.codec import (
    WireError,
    check_more_tail,
    decode_extend,
    decode_serve_params,
    encode_scores,
)
from acespec.shared.served import ServeParams

log = logging.getLogger(__name__)


def _coalescible(msg) -> bool:
    """An Extend that may join the previous one's forward pass (a commit must wait: it may
    name a node that pass has not scored yet)."""
    return (not isinstance(msg, Exception) and msg is not grpc.aio.EOF
            and msg.WhichOneof("msg") == "extend" and not msg.extend.HasField("commit"))


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(self, engine: Engine, auth_tokens: frozenset[str] = frozenset(),
                 idle_timeout_s: float = 300.0, default_params: ServeParams = ServeParams()):
        self.engine, self.auth_tokens = engine, auth_tokens
        self.idle_timeout_s, self.default_params = idle_timeout_s, default_params

    # -- boundary helpers ---------------------------------------------------------

    def _authorize(self, context) -> None:
        if not self.auth_tokens:
            return
        md = dict(context.invocation_metadata() or ())
        header = md.get("authorization", "")
        if not header.startswith("Bearer ") or header[7:] not in self.auth_tokens:
            raise Unauthenticated("missing or wrong bearer token (metadata 'authorization: "
                                  "Bearer <token>')")

    async def _fail(self, context, err: Exception) -> None:
        if isinstance(err, WireError):
            err = InvalidArgument(str(err))
        if not isinstance(err, SessionError):
            log.exception("internal error", exc_info=err)
            err = SessionError("internal error (see the verifier's log)")
        if self.engine.metrics:
            self.engine.metrics.errors.labels(err.code).inc()
        log.info("session ended: %s %s", err.code, err)
        await context.abort(grpc.StatusCode[err.code], str(err))

    def _count(self, direction: str, msg) -> None:
        if self.engine.metrics:
            self.engine.metrics.message_bytes.labels(direction).inc(msg.ByteSize())

    async def _read(self, context):
        try:
            msg = await asyncio.wait_for(context.read(), self.idle_timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"session idle for more than {self.idle_timeout_s:g} s "
                                   "(--idle-timeout); its KV was freed") from None
        except DecodeError as e:
            raise InvalidArgument(f"malformed Uplink message: {e}") from None
        if msg is not grpc.aio.EOF:
            self._count("up", msg)
        return msg

    async def _write(self, context, msg) -> None:
        self._count("down", msg)
        await context.write(msg)

    # -- Session ------------------------------------------------------------------

    async def Session(self, request_iterator, context):  # noqa: N802 - gRPC name
        session_id = None
        try:
            self._authorize(context)
            first = await self._read(context)
            if first is grpc.aio.EOF:
                return
            if first.WhichOneof("msg") != "open":
                raise FailedPrecondition(f"{first.WhichOneof('msg') or 'empty message'} "
                                         "before Open: the first message must be Open")
            session_id, session = await self._open(first.open, context)
            await self._loop(session, context)
        except (SessionError, WireError) as e:
            await self._fail(context, e)
        except asyncio.CancelledError:
            log.info("session %s cancelled by the client", session_id)
            raise
        except Exception as e:  # noqa: BLE001 - becomes INTERNAL for this session only
            await self._fail(context, e)
        finally:
            self.engine.close(session_id)
            if session_id and self.engine.metrics:
                self.engine.metrics.sessions_active.dec()

    async def _open(self, msg: pb.Open, context):
        self.engine.check_handshake(msg.protocol_version, msg.vocab_hash)
        if not msg.vocab_hash:
            raise FailedPrecondition("Open.vocab_hash is required")
        params = decode_serve_params(msg.sampling, self.default_params)
        res = await self.engine.open(list(msg.prompt_tokens), params, msg.seed,
                                     msg.limits.max_live_nodes)
        if self.engine.metrics:
            self.engine.metrics.sessions_opened.inc()
            self.engine.metrics.sessions_active.inc()
        await self._write(context, pb.Downlink(opened=pb.Opened(
            session_id=res.session_id, model_id=self.engine.model_id,
            vocab_hash=self.engine.vocab_hash, max_live_nodes=res.max_live_nodes,
            k_max=params.k_max, root=encode_scores([res.root], params.sampling.greedy))))
        return res.session_id, res.session

    async def _loop(self, session, context) -> None:
        """Process the stream in order. A reader runs ahead, so Extends that queue up while
        the target is busy are scored together in one forward pass (one Scores each)."""
        inbox: asyncio.Queue = asyncio.Queue()
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
                    session.commit(msg.commit.node_id)
                elif kind == "more_tail":
                    node_id, n = check_more_tail(msg.more_tail)
                    ids, units = session.more_tail(node_id, n)
                    await self._write(context, pb.Downlink(tail=pb.TailSamples(
                        node_id=node_id, tail_token=ids.tolist(), tail_token_p=units.tolist())))
                elif kind == "open":
                    raise FailedPrecondition("second Open on one stream; open a new stream")
                else:
                    raise InvalidArgument("empty Uplink message (no field of the oneof is set)")
        finally:
            reader.cancel()

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
            session.commit(first.commit)
        batches, next_id = [], session.next_id
        for m, _ in group:
            nodes = decode_extend(m.extend, next_id)
            batches.append((nodes.first_id, nodes.tokens, nodes.parents))
            next_id += len(nodes.tokens)
        greedy = session.params.sampling.greedy
        for scores, (_, arrived) in zip(await self.engine.extend_many(session, batches), group):
            msg = encode_scores(scores, greedy)
            msg.server_time = min(2**32 - 1, round((time.perf_counter() - arrived) * 1e4))
            await self._write(context, pb.Downlink(scores=msg))

    # -- Generate -------------------------------------------------------------------

    async def Generate(self, request, context):  # noqa: N802 - gRPC name
        try:
            self._authorize(context)
            self._count("up", request)
            self.engine.check_handshake(request.protocol_version, request.vocab_hash)
            params = decode_serve_params(request.sampling, self.default_params)
            count = 0
            async for token in self.engine.generate(list(request.prompt_tokens), params,
                                                    request.seed, request.max_tokens or 128,
                                                    list(request.stop_tokens)):
                count += 1
                chunk = pb.GenerateChunk(tokens=[token], target_forwards=count)
                self._count("down", chunk)
                yield chunk
            yield pb.GenerateChunk(done=True, target_forwards=count)
        except (SessionError, WireError) as e:
            await self._fail(context, e)
