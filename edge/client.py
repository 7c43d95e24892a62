"""Client side of the protocol: open a verifier session, stream Extend/Commit/MoreTail up,
decode Scores down into `acespec.shared` types. Used by the edge engine and the tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from acespec.proto import CLIENT_KEY, PROTOCOL_VERSION, SESSION_KEY
from acespec.proto import acespec_pb2 as pb
from acespec.proto import acespec_pb2_grpc as pb_grpc
from acespec.proto.codec import (
    decode_counts,
    decode_logprobs,
    decode_scores,
    encode_extend,
    encode_grow,
    encode_serve_params,
)
from acespec.proto.sizes import FRAMING
from acespec.shared.logprobs import TokenLogprob
from acespec.shared.served import NodeScore, ServeParams


class VerifierUnfit(Exception):
    """The verifier cannot serve this request as asked (a deployment problem, not a lost
    connection): retrying would only fail again."""


@dataclass(frozen=True)
class Tail:
    """More tail samples of one node (the answer to MoreTail)."""

    node_id: int
    ids: list[int]
    units: list[int]


# A verifier that comes back should be found quickly: gRPC's default reconnect backoff
# starts at 1 s and grows to 120 s, far longer than the edge's own retry schedule; here the
# channel tries at most 0.5 s apart (an attempt at a verifier that is down costs a SYN), so
# a request that comes while it restarts finds it within half a second of its return. The
# "min reconnect backoff" is gRPC's connect timeout (a connection attempt's handshake must
# finish within it): at its default, 20 s, not the 100 ms of the first retry, or no
# connection over a link with an RTT above ~100 ms (3G, satellite) succeeds at first try.
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 20000),
                   ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.keepalive_time_ms", 20000),
                   # No bandwidth-delay-product probing: a PING (and its ACK) per burst of
                   # data costs more than the tokens on a 50 kbit/s link; windows are ample.
                   ("grpc.http2.bdp_probe", 0)]


def channel(target: str, tls_root_cert: bytes | None = None) -> grpc.aio.Channel:
    if tls_root_cert is not None:
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(tls_root_cert),
                                       options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


def check_token(token: str) -> str:
    """A bearer token gRPC can carry in a header (printable ASCII, no spaces), or ValueError:
    anything else fails inside gRPC as an opaque 'Invalid metadata' on every call."""
    if not token or not all(33 <= ord(ch) <= 126 for ch in token):
        raise ValueError("the bearer token must be printable ASCII without spaces")
    return token


def read_token_file(path: str | Path) -> str:
    """The bearer token in `path`: its first non-empty line (so the verifier's own file, one
    accepted token per line, works here too). ValueError names the file if it holds none."""
    lines = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"--auth-token-file {path}: the file holds no token")
    try:
        return check_token(lines[0])
    except ValueError as e:
        raise ValueError(f"--auth-token-file {path}: {e}") from None


def metadata(token: str | None, session_key: str | None = None, client: str | None = None
             ) -> tuple:
    """A call's metadata: its session key (a load balancer's stickiness), the bearer token,
    and the edge's id (client: its sessions share one client's part of the passes)."""
    md = [(SESSION_KEY, session_key or uuid.uuid4().hex)]
    if token:
        md.append(("authorization", f"Bearer {token}"))
    if client:
        md.append((CLIENT_KEY, client))
    return tuple(md)


@dataclass(frozen=True)
class Decided:
    """Tokens the verifier decided at position, position+1, ... (decided sessions)."""

    position: int
    tokens: list[int]
    passes: int  # the session's forward passes so far
    done: bool  # the verifier stopped deciding (max_tokens, a stop token, the context)
    counts: dict | None  # with done: the verifier's account (acespec.proto.codec.decode_counts)
    acked: int = 0  # uplink messages the verifier had applied before this pass
    held_s: float = 0.0  # seconds since the last of them arrived there (queue + pass)
    logprobs: list[TokenLogprob] | None = None  # the target's, per token (when asked)


class VerifierTooOld(VerifierUnfit):
    """The verifier does not serve what the edge asked for (e.g. coupled sampling)."""


class CloudSession:
    """One Session stream. Call `open`, then `extend`/`commit`/`more_tail` and `recv`."""

    def __init__(self, ch: grpc.aio.Channel, token: str | None = None,
                 session_key: str | None = None, client: str | None = None):
        self._stub = pb_grpc.VerifierStub(ch)
        self._call = self._stub.Session(metadata=metadata(token, session_key, client))
        self.next_id = 0
        self.session_id = self.model_id = ""
        self.max_live_nodes = 0
        self.bytes_up = self.bytes_down = 0  # message bytes + FRAMING each
        self.messages_up = 0  # uplink messages written
        self.server_s = 0.0  # the last Scores' time at the verifier (queue + pass), seconds
        # perf_counter since which the verifier owes a message (None: nothing owed): from
        # the first uplink message, an open session always owes the next one (decided:
        # the next pass; tree: Scores for nodes in flight) until the verifier says done.
        # The edge's stall detection reads it.
        self.owed_since: float | None = None
        self.wait_s = 0.0  # running mean of how long an owed message took to come, seconds
        self._half_closed = False
        self._early: list[pb.Downlink] = []  # read by open_decided: the first Decided

    async def _write(self, msg: pb.Uplink) -> None:
        self.bytes_up += msg.ByteSize() + FRAMING
        self.messages_up += 1
        if self.owed_since is None:
            self.owed_since = time.perf_counter()
        try:
            await self._call.write(msg)
        except asyncio.InvalidStateError:  # the verifier ended the stream while we wrote
            await self._raise_ended()

    async def _raise_ended(self) -> None:
        """Raise what ended the stream: its status as an AioRpcError (the engine decides
        whether to resume), or ConnectionError if the verifier closed it without one."""
        code = await self._call.code()
        if code == grpc.StatusCode.OK:
            raise ConnectionError("verifier closed the session stream")
        raise grpc.aio.AioRpcError(code, await self._call.initial_metadata(),
                                   await self._call.trailing_metadata(),
                                   details=await self._call.details())

    async def open(self, prompt: Sequence[int], params: ServeParams, seed: int,
                   vocab_hash: str, max_live_nodes: int = 0) -> NodeScore:
        """Send Open; returns the root's score (node 0)."""
        await self._write(pb.Uplink(open=pb.Open(
            protocol_version=PROTOCOL_VERSION, vocab_hash=vocab_hash,
            prompt_tokens=list(map(int, prompt)), sampling=encode_serve_params(params),
            seed=seed, limits=pb.Limits(max_live_nodes=max_live_nodes))))
        msg = await self._read()
        opened = msg.opened
        self.session_id, self.model_id = opened.session_id, opened.model_id
        self.max_live_nodes = opened.max_live_nodes
        self.next_id = 1
        self._check_coupled(params, opened)
        return decode_scores(opened.root)[0]

    async def open_decided(self, prompt: Sequence[int], params: ServeParams, seed: int,
                           vocab_hash: str, max_tokens: int, stop: Sequence[int],
                           gap: bool = True, logprobs: int | None = None) -> NodeScore | None:
        """Open a session the verifier decides (greedy or coupled). Returns None when it
        does; a verifier that will not decide it answers as for an edge-decided session:
        its root's score (the caller then walks the scores on this stream). gap=False: the verifier's gap
        drafter, if it has one, proposes nothing here. logprobs: every Decided carries the
        target's logprobs, with that many alternatives per token."""
        await self._write(pb.Uplink(open=pb.Open(
            protocol_version=PROTOCOL_VERSION, vocab_hash=vocab_hash,
            prompt_tokens=list(map(int, prompt)), sampling=encode_serve_params(params),
            seed=seed, decide=pb.Decide(max_tokens=max_tokens, stop_tokens=list(stop),
                                        no_gap=not gap, logprobs=logprobs is not None,
                                        top_logprobs=logprobs or 0,
                                        first_before_opened=True))))
        msg = await self._read()
        if msg.WhichOneof("msg") == "decided":  # the first token, ahead of Opened: the
            # verifier decides and serves the sampling asked (Opened comes later)
            self._early.append(msg)
            self.next_id = 0
            return None
        opened = msg.opened
        self._take_opened(opened)
        self.max_live_nodes, self.next_id = opened.max_live_nodes, 1
        if opened.decides:
            self.next_id = 0  # Grow node ids count from 0
        self._check_coupled(params, opened)
        return None if opened.decides else decode_scores(opened.root)[0]

    def _take_opened(self, opened: pb.Opened) -> None:
        self.session_id, self.model_id = opened.session_id, opened.model_id

    @staticmethod
    def _check_coupled(params: ServeParams, opened: pb.Opened) -> None:
        if params.sampling.coupled and not params.sampling.greedy and not opened.coupled:
            raise VerifierTooOld("the verifier does not serve coupled sampling (it is older "
                                 "than this edge): upgrade it, or use --sampling exact")

    async def grow(self, anchor: int, tokens: Sequence[int], parents: Sequence[int]) -> int:
        """Decided sessions: new tree nodes (parents: node ids, or -1 for
        the decided text up to `anchor`). Returns the first new node's id."""
        first = self.next_id
        await self._write(pb.Uplink(grow=encode_grow(anchor, first, tokens, parents)))
        self.next_id += len(tokens)
        return first

    async def extend(self, tokens: Sequence[int], parents: Sequence[int] | None = None,
                     commit: int | None = None) -> int:
        """Append nodes (parents default to a chain off the newest node), after committing
        `commit` if given; returns the first new node id. Scores arrive through `recv`."""
        first = self.next_id
        if parents is None:
            parents = [first - 1 + i for i in range(len(tokens))]
        await self._write(pb.Uplink(extend=encode_extend(first, tokens, parents, commit)))
        self.next_id += len(tokens)
        return first

    async def commit(self, node_id: int) -> None:
        await self._write(pb.Uplink(commit=pb.Commit(node_id=node_id)))

    async def more_tail(self, node_id: int, n: int) -> None:
        await self._write(pb.Uplink(more_tail=pb.MoreTail(node_id=node_id, n=n)))

    async def recv(self) -> list[NodeScore] | Tail | Decided:
        """The next downlink message: node scores, tail samples, or decided tokens."""
        msg = await self._read()
        kind = msg.WhichOneof("msg")
        if kind == "opened":  # a decided session's, after its first token
            self._take_opened(msg.opened)
            msg = await self._read()
            kind = msg.WhichOneof("msg")
        if kind == "decided":
            d = msg.decided
            if d.done:
                self.owed_since = None
            return Decided(d.position, list(d.tokens), d.passes, d.done,
                           decode_counts(d.counts) if d.HasField("counts") else None,
                           d.acked, d.held_us * 1e-6,
                           decode_logprobs(d.logprobs, len(d.tokens))
                           if d.HasField("logprobs") else None)
        if kind == "tail":
            return Tail(msg.tail.node_id, list(msg.tail.tail_token), list(msg.tail.tail_token_p))
        self.server_s = msg.scores.server_time * 1e-4
        return decode_scores(msg.scores)

    async def _read(self) -> pb.Downlink:
        if self._early:  # read ahead by open_decided, counted then
            return self._early.pop(0)
        msg = await self._call.read()
        if msg is grpc.aio.EOF:
            raise ConnectionError("verifier closed the session stream")
        self.bytes_down += msg.ByteSize() + FRAMING
        now = time.perf_counter()
        if self.owed_since is not None:
            self.wait_s += 0.1 * (now - self.owed_since - self.wait_s)
        self.owed_since = now
        return msg

    async def done_writing(self) -> None:
        """Half-close: the verifier sees the end of the uplink."""
        if not self._half_closed:
            self._half_closed = True
            await self._call.done_writing()

    async def close(self) -> None:
        """Half-close and wait for the verifier to end the stream (frees its KV)."""
        await self.done_writing()
        await self._call.code()

    def cancel(self) -> None:
        self._call.cancel()


async def generate(ch: grpc.aio.Channel, prompt: Sequence[int], params: ServeParams, seed: int,
                   max_tokens: int, vocab_hash: str = "", token: str | None = None,
                   stop: Sequence[int] = (), sizes: list[int] | None = None):
    """Cloud-only decoding: yields token ids as they stream in. `sizes`, if given, collects
    the serialized size of the request (first) and of each chunk."""
    chunks = generate_chunks(ch, prompt, params, seed, max_tokens, vocab_hash, token, stop,
                             sizes)
    async with contextlib.aclosing(chunks):
        async for tokens, _ in chunks:
            for t in tokens:
                yield t


async def generate_chunks(ch: grpc.aio.Channel, prompt: Sequence[int], params: ServeParams,
                          seed: int, max_tokens: int, vocab_hash: str = "",
                          token: str | None = None, stop: Sequence[int] = (),
                          sizes: list[int] | None = None, logprobs: int | None = None,
                          client: str | None = None):
    """Cloud-only decoding: yields (token ids, the target's logprobs of each or None) per
    chunk as they stream in; logprobs asks for them, with that many alternatives per token.
    `sizes`, if given, collects the serialized size of the request (first) and of each
    chunk."""
    stub = pb_grpc.VerifierStub(ch)
    req = pb.GenerateRequest(protocol_version=PROTOCOL_VERSION, vocab_hash=vocab_hash,
                             prompt_tokens=list(map(int, prompt)),
                             sampling=encode_serve_params(params), seed=seed,
                             max_tokens=max_tokens, stop_tokens=list(stop),
                             logprobs=logprobs is not None, top_logprobs=logprobs or 0)
    if sizes is not None:
        sizes.append(req.ByteSize())
    call = stub.Generate(req, metadata=metadata(token, client=client))
    try:
        async for chunk in call:
            if sizes is not None:
                sizes.append(chunk.ByteSize())
            if chunk.tokens:
                yield list(chunk.tokens), (decode_logprobs(chunk.logprobs, len(chunk.tokens))
                                           if chunk.HasField("logprobs") else None)
            if chunk.done:
                return
    finally:
        call.cancel()  # the caller stopped early (max_tokens, a stop): the verifier stops too


async def prompt_logprobs(ch: grpc.aio.Channel, prompt: Sequence[int], top_n: int,
                          vocab_hash: str = "", token: str | None = None,
                          client: str | None = None) -> list[TokenLogprob]:
    """The target's logprobs of prompt[1:], each given what precedes it, with top_n
    alternatives (one Generate call that generates nothing)."""
    stub = pb_grpc.VerifierStub(ch)
    req = pb.GenerateRequest(protocol_version=PROTOCOL_VERSION, vocab_hash=vocab_hash,
                             prompt_tokens=list(map(int, prompt)), max_tokens=0,
                             prompt_logprobs=True, top_logprobs=top_n)
    call = stub.Generate(req, metadata=metadata(token, client=client))
    try:
        async for chunk in call:
            if chunk.HasField("prompt_logprobs"):
                return decode_logprobs(chunk.prompt_logprobs, len(prompt) - 1)
            break
    finally:
        call.cancel()
    raise VerifierTooOld("the verifier sent no prompt logprobs (it is older than this "
                         "edge): upgrade it, or ask without echo and logprobs")
