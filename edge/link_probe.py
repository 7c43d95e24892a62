"""A short probe of the link to the verifier: its round trip and its rate each way, timed with
calls that cost the verifier almost nothing but bytes.

* Round trip: the median of a few empty gRPC health checks, less the time their own frames
  take at the measured rates.
* Uplink: health checks asking for a service named by n bytes (the verifier answers NOT_FOUND
  whatever n is), small and large n alternated; rate = 8·Δn / Δtime of the medians.
* Downlink: Generate with prompt logprobs and no new token, over the same prompt with 0 and
  with 20 alternatives per token: the same forward pass, so Δtime is the extra bytes'.

A size grows until its Δtime is long enough to read (MIN_DELTA_S) or reaches its cap; a link
still faster than that is reported as at least the rate the cap gave."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from acespec.edge.client import metadata
from acespec.proto import PROTOCOL_VERSION
from acespec.proto import acespec_pb2 as pb
from acespec.proto import acespec_pb2_grpc as pb_grpc
from acespec.shared.logprobs import MAX_TOP_LOGPROBS

HEALTH = "/grpc.health.v1.Health/Check"
# What one empty health check puts on the wire each way on an open channel, HTTP/2 frames and
# HPACK'd headers included (40 of them through `acespec sim link`, its byte counts, grpcio
# 1.85): taken out of the round trip at the measured rates.
PING_UP_BYTES, PING_DOWN_BYTES = 57, 66
PINGS, REPEATS = 5, 3
MIN_DELTA_S = 0.4
MAX_UP_BYTES = 4 << 20  # gRPC's default limit on a received message is 4 MiB
MAX_PROMPT = 1024  # tokens of the downlink probe's prompt


@dataclass(frozen=True)
class LinkRates:
    rtt_s: float
    up_bps: float  # bits/s
    down_bps: float
    up_at_least: bool  # the probe's cap was reached: the link may be faster
    down_at_least: bool


def _health_request(service: bytes) -> bytes:
    """grpc.health.v1.HealthCheckRequest{service} (field 1, length-delimited)."""
    n, length = len(service), bytearray()
    while True:
        length.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    return (b"\x0a" + bytes(length) + service) if service else b""


async def _timed(call: Callable[[], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    await call()
    return time.perf_counter() - t0


async def _health(ch: grpc.aio.Channel, service: bytes) -> None:
    check = ch.unary_unary(HEALTH, request_serializer=lambda b: b,
                           response_deserializer=lambda b: b)
    try:
        await check(_health_request(service))
    except grpc.aio.AioRpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:  # an unknown service: the answer asked for
            raise


async def _delta(small: Callable[[], Awaitable[object]],
                 large: Callable[[], Awaitable[object]]) -> float:
    """Median time of `large` minus median time of `small`, alternated REPEATS times."""
    ts, tl = [], []
    for _ in range(REPEATS):
        ts.append(await _timed(small))
        tl.append(await _timed(large))
    return statistics.median(tl) - statistics.median(ts)


async def _grow(measure: Callable[[int], Awaitable[tuple[float, float]]], size: int,
                cap: int) -> tuple[float, bool]:
    """(bits/s, at_least): measure(size) -> (extra bytes, Δtime), size grown to a readable Δ."""
    while True:
        extra, dt = await measure(size)
        if dt >= MIN_DELTA_S or size >= cap:
            return extra * 8 / max(dt, 1e-6), dt < MIN_DELTA_S
        size = min(cap, size * 4 if dt <= 0 else int(size * 1.5 * MIN_DELTA_S / dt) + 1)


async def up_rate(ch: grpc.aio.Channel) -> tuple[float, bool]:
    async def measure(n: int) -> tuple[float, float]:
        dt = await _delta(lambda: _health(ch, b"x"), lambda: _health(ch, b"x" * n))
        return n - 1, dt
    return await _grow(measure, 2048, MAX_UP_BYTES)


async def down_rate(ch: grpc.aio.Channel, tokens: Sequence[int], vocab_hash: str,
                    token: str | None) -> tuple[float, bool]:
    stub = pb_grpc.VerifierStub(ch)

    async def logprobs(prompt: list[int], top_n: int) -> int:
        """Ask for the prompt's logprobs; the answer's bytes."""
        call = stub.Generate(pb.GenerateRequest(
            protocol_version=PROTOCOL_VERSION, vocab_hash=vocab_hash, prompt_tokens=prompt,
            max_tokens=0, prompt_logprobs=True, top_logprobs=top_n), metadata=metadata(token))
        try:
            async for chunk in call:
                if chunk.HasField("prompt_logprobs"):
                    return chunk.ByteSize()
        finally:
            call.cancel()
        return 0

    async def measure(n: int) -> tuple[float, float]:
        prompt = [int(tokens[i % len(tokens)]) for i in range(n)]
        extra = await logprobs(prompt, MAX_TOP_LOGPROBS) - await logprobs(prompt, 0)
        dt = await _delta(lambda: logprobs(prompt, 0), lambda: logprobs(prompt, MAX_TOP_LOGPROBS))
        return extra, dt
    return await _grow(measure, 16, MAX_PROMPT)


async def probe(ch: grpc.aio.Channel, tokens: Sequence[int], vocab_hash: str,
                token: str | None) -> LinkRates:
    """The link's round trip and rates (`tokens`: any of the target's token ids, >= 1)."""
    pings = [await _timed(lambda: _health(ch, b"")) for _ in range(PINGS)]
    up, up_min = await up_rate(ch)
    down, down_min = await down_rate(ch, tokens, vocab_hash, token)
    frames = PING_UP_BYTES * 8 / up + PING_DOWN_BYTES * 8 / down
    rtt = max(statistics.median(pings) - frames, min(pings) / 2)
    return LinkRates(rtt, up, down, up_min, down_min)
