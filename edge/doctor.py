"""`acespec edge doctor`: with the settings `edge serve` would use (the file and the flags),
load the drafter, reach the verifier (TLS, key), open one session (which the verifier refuses
when the drafter's vocabulary is not its target's), probe the link's round trip and rate each
way (acespec.edge.link_probe), and say in a few lines what it found and what to do."""

from __future__ import annotations

import asyncio
import sys

import grpc

from acespec import pairs
from acespec.edge import commands, config, link_probe
from acespec.edge.client import CloudSession, channel, read_token_file
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams

SAMPLE = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
PROBE_S = 120.0  # the link probe's limit (about 5 s at 50 kbit/s, 50 ms)


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
        try:
            model = await asyncio.wait_for(_open(ch, token, codec), args.timeout)
        except grpc.aio.AioRpcError as e:
            return _fail(_refused(e, args))
        except asyncio.TimeoutError:
            return _fail(f"the verifier at {args.cloud} opened no session within "
                         f"{args.timeout:g} s (busy, or wedged?)")
        print(f"session: opened (target {model!r}; the drafter's vocabulary is the target's"
              f"{', the key was accepted' if token else ''})")
        tokens = codec.encode(SAMPLE) or [0]
        try:
            link = await asyncio.wait_for(
                link_probe.probe(ch, tokens, codec.vocab_hash, token), PROBE_S)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as e:
            why = e.details() if isinstance(e, grpc.aio.AioRpcError) else f"over {PROBE_S} s"
            return _fail(f"the link probe failed: {why}")
    finally:
        await ch.close()
    print(f"link: round trip {link.rtt_s * 1e3:.0f} ms, up "
          f"{_rate(link.up_bps, link.up_at_least)}, down "
          f"{_rate(link.down_bps, link.down_at_least)}")
    print(_advice(link, args.offline))
    return 0


def _rate(bps: float, at_least: bool) -> str:
    text = f"{bps / 1e6:.1f} Mbit/s" if bps >= 1e6 else f"{bps / 1e3:.1f} kbit/s"
    return f">= {text}" if at_least else text


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


def _advice(link: link_probe.LinkRates, offline: str) -> str:
    if link.rtt_s < 0.005 and link.down_bps >= 100e6:
        say = ("the verifier is on this network: drafting here spares the verifier's "
               "compute more than your wait")
    else:
        say = (f"over a {link.rtt_s * 1e3:.0f} ms round trip, drafting here (the default mode) "
               "keeps the verifier busy while the link carries only token ids and verdicts")
    if offline == "local":
        return f"advice: {say}; offline = \"local\": answers continue from the drafter, " \
            "marked unverified, while the link is down"
    return f"advice: {say}; for a laptop that roams, offline = \"local\" keeps answering " \
        "from the drafter while the link is down"


def _fail(message: str) -> int:
    print(f"problem: {message}", file=sys.stderr)
    return 1
