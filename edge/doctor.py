"""`acespec edge doctor`: with the settings `edge serve` would use (the file and the flags),
load the drafter, reach the verifier (TLS, key), open one session (which the verifier refuses
when the drafter's vocabulary is not its target's), time the round trip, and say in a few
lines what it found and what to do about it."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import grpc

from acespec import pairs
from acespec.edge import commands, config
from acespec.edge.client import CloudSession, channel, read_token_file
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams

HEALTH = "/grpc.health.v1.Health/Check"  # grpc.health.v1: an empty request asks for the server
SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}
PINGS = 5


def run(args) -> int:
    print(f"settings file: {args._settings_file or f'none ({config.default_path()})'}")
    try:
        token = read_token_file(args.auth_token_file) if args.auth_token_file else None
        root = commands.read_file("--tls-ca", args.tls_ca) if args.tls_ca else None
        pairs.apply(args)
        codec = _codec(args)
    except (ValueError, OSError) as e:
        return _fail(f"settings: {config.blame(args, str(e))}")
    print(f"drafter: {args.drafter} (vocabulary {codec.vocab_hash[:12]})")
    link = f"TLS, root {args.tls_ca}" if root else "plaintext"
    key = f"key from {args.auth_token_file}" if token else "no key"
    print(f"verifier: {args.cloud} ({link}, {key})")
    return asyncio.run(_check(args, codec, root, token))


def _codec(args):
    """The drafter's TextCodec (its vocabulary), the drafter loaded only to tokenize."""
    if args.drafter == "ngram":
        return commands.codec_and_drafter(args)[0]
    return commands.llama_codec_and_drafter(args.drafter, n_ctx=256, n_seq_max=1)[0]


async def _check(args, codec, root: bytes | None, token: str | None) -> int:
    ch = channel(args.cloud, root)
    try:
        try:
            await asyncio.wait_for(ch.channel_ready(), args.timeout)
        except asyncio.TimeoutError:
            hint = ("is it serving TLS with a certificate that tls-ca signed?" if root else
                    "is it up, and serving plaintext (a TLS verifier needs tls-ca)?")
            return _fail(f"cannot reach the verifier at {args.cloud} within {args.timeout:g} s: "
                         f"{hint}")
        rtts = [await _ping(ch, args.timeout) for _ in range(PINGS)]
        print(f"round trip: {statistics.median(rtts) * 1e3:.0f} ms (median of {PINGS}, "
              f"{min(rtts) * 1e3:.0f}-{max(rtts) * 1e3:.0f} ms)")
        try:
            model = await asyncio.wait_for(_open(ch, token, codec), args.timeout)
        except grpc.aio.AioRpcError as e:
            return _fail(_refused(e, args))
        except asyncio.TimeoutError:
            return _fail(f"the verifier at {args.cloud} opened no session within "
                         f"{args.timeout:g} s (busy, or wedged?)")
    finally:
        await ch.close()
    print(f"session: opened (target {model!r}; the drafter's vocabulary is the target's"
          f"{', the key was accepted' if token else ''})")
    print(_advice(statistics.median(rtts)))
    return 0


async def _ping(ch: grpc.aio.Channel, timeout: float) -> float:
    check = ch.unary_unary(HEALTH, request_serializer=lambda _: b"",
                           response_deserializer=lambda b: b)
    t0 = time.perf_counter()
    await check(None, timeout=timeout)
    return time.perf_counter() - t0


async def _open(ch: grpc.aio.Channel, token: str | None, codec) -> str:
    session = CloudSession(ch, token)
    prompt = codec.encode("Hello") or [0]
    await session.open(prompt, ServeParams(SamplingParams()), seed=0,
                       vocab_hash=codec.vocab_hash)
    session.cancel()
    return session.model_id


def _refused(e: grpc.aio.AioRpcError, args) -> str:
    code, details = e.code(), e.details()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return (f"the verifier refused the key ({details}): set auth-token-file to a file "
                "holding one of the verifier's tokens")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return (f"the verifier refused the session ({details}): the drafter must share the "
                "target's tokenizer (the same pair on both sides)")
    return f"the verifier at {args.cloud} refused a session ({code.name}): {details}"


def _advice(rtt_s: float) -> str:
    ms = rtt_s * 1e3
    if ms < 5:
        say = ("the verifier is next door: drafting here saves the verifier's time more than "
               "yours; any mode works")
    else:
        say = (f"at {ms:.0f} ms per round trip, drafting here hides the link: keep the "
               "default mode")
    return f"advice: {say}; for a laptop that roams, offline = \"local\" keeps answering " \
        "from the drafter while the link is down"


def _fail(message: str) -> int:
    print(f"problem: {message}", file=sys.stderr)
    return 1
