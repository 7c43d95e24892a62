"""`acespec edge ...`: generate against a remote verifier (more commands join later)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

EXIT_USAGE, EXIT_UNREACHABLE, EXIT_REFUSED = 2, 3, 4


def add_parser(sub) -> None:
    from acespec.models import DEMO_DRAFTER, DEMO_TARGET

    p = sub.add_parser("edge", help="the edge: drafter + engine talking to a cloud verifier")
    esub = p.add_subparsers(dest="edge_cmd", required=True, metavar="COMMAND")
    g = esub.add_parser(
        "generate", help="stream a continuation of PROMPT, drafting locally, verified remotely",
        description="Speculative decoding against a cloud verifier: the llama.cpp drafter "
        "proposes tokens, the verifier scores them, this process accepts or rejects them "
        "exactly. Streams the accepted text with a live status line on stderr.")
    g.add_argument("prompt")
    g.add_argument("--cloud", default="localhost:50051", help="verifier HOST:PORT (default: %(default)s)")
    g.add_argument("--drafter", default=str(DEMO_DRAFTER),
                   help="drafter GGUF, or 'ngram' (default: the demo drafter)")
    g.add_argument("--tokenizer", default=str(DEMO_TARGET),
                   help="tokenizer.json or its folder, used with --drafter ngram")
    _add_engine_args(g, "acespec")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--send-mass", type=float, default=0.9, help="downlink: sent mass per node")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--auth-token-file", help="bearer token for the verifier")
    g.add_argument("--tls-ca", help="PEM root certificate: connect with TLS")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object {text, token_ids, stats} at the end")
    g.set_defaults(func=run_generate)
    sv = esub.add_parser(
        "serve", help="a local OpenAI-compatible server (completions, chat, SSE streaming)",
        description="Serve /v1/completions, /v1/chat/completions (when the drafter's GGUF has a "
        "chat template), /v1/models, /health and /metrics on a local port; generation is "
        "drafted here and verified by the cloud verifier.")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--cloud", default="localhost:50051", help="verifier HOST:PORT")
    sv.add_argument("--drafter", default=str(DEMO_DRAFTER), help="drafter GGUF")
    _add_engine_args(sv, "pipeline")
    sv.add_argument("--send-mass", type=float, default=0.9)
    sv.add_argument("--model-name", default="acespec", help="the model id clients send")
    sv.add_argument("--auth-token-file", help="bearer token for the verifier")
    sv.add_argument("--tls-ca", help="PEM root certificate: connect with TLS")
    sv.set_defaults(func=run_serve)


def _add_engine_args(p, mode: str) -> None:
    """Mode, shape and state-cache flags shared by `generate` and `serve`."""
    p.add_argument("--mode", default=mode, choices=["ar", "sd", "pipeline", "acespec"],
                   help="ar: cloud only; sd: draft-send-wait; pipeline: streamed drafts; "
                   "acespec: pipeline + pre-scored recovery branches (default: %(default)s)")
    p.add_argument("--depth", type=int, default=None,
                   help="drafts per Extend; unset: adaptive (starts at 4, follows the link)")
    p.add_argument("--window", type=int, default=None,
                   help="most live drafted nodes; unset: adaptive (starts at 16)")
    b = p.add_argument_group("state cache budgets per chunk (acespec mode; unset = derived "
                             "from the measured link and drafter)")
    b.add_argument("--cache-draft-ms", type=float, default=None, help="drafter time for branches")
    b.add_argument("--cache-uplink-bytes", type=float, default=None)
    b.add_argument("--cache-downlink-bytes", type=float, default=None)
    b.add_argument("--cache-cloud-nodes", type=float, default=8.0,
                   help="branch nodes the verifier scores per chunk (default: %(default)s)")
    b.add_argument("--cache-kv-mb", type=float, default=64.0,
                   help="edge memory for branch KV, MB (default: %(default)s)")


def engine_config(args, **kw):
    """EngineConfig from the shared flags (an unset depth or window makes it adaptive)."""
    from acespec.edge.engine import EngineConfig
    from acespec.edge.state_cache import CacheConfig

    adaptive = args.depth is None and args.window is None
    depth = args.depth or 4
    window = max(args.window or 16, depth)
    cache = CacheConfig(kv_bytes=args.cache_kv_mb * 1e6, draft_ms=args.cache_draft_ms,
                        uplink_bytes=args.cache_uplink_bytes,
                        downlink_bytes=args.cache_downlink_bytes,
                        cloud_nodes=args.cache_cloud_nodes)
    return EngineConfig(mode=args.mode, depth=depth, window=window, cache=cache,
                        adaptive=adaptive, **kw)


def _codec_and_drafter(args):
    from acespec.edge.text import TextCodec

    if args.drafter == "ngram":
        from acespec.edge.ngram_drafter import NgramDrafter

        codec = TextCodec.from_tokenizer(args.tokenizer)
        from acespec.shared.tokenizer import Tokenizer

        return codec, NgramDrafter(Tokenizer.load(args.tokenizer).vocab_size)
    from acespec.edge.llama_drafter import LlamaDrafter, LlamaDrafterConfig

    if not Path(args.drafter).is_file():
        raise FileNotFoundError(f"no drafter GGUF at {args.drafter}; pass --drafter FILE or 'ngram'")
    drafter = LlamaDrafter(args.drafter, LlamaDrafterConfig(n_seq_max=2))
    return TextCodec.from_drafter(drafter), drafter


def run_generate(args) -> int:
    import grpc

    from acespec.edge.client import channel
    from acespec.edge.engine import EdgeEngine, EngineConfig
    from acespec.edge.text import StreamDecoder
    from acespec.shared.config import ConfigError, SamplingParams
    from acespec.shared.served import ServeParams

    def fail(code: int, msg: str) -> int:
        print(f"acespec edge generate: error: {msg}", file=sys.stderr)
        return code

    try:
        serve = ServeParams(SamplingParams(args.temperature, args.top_k, args.top_p),
                            send_mass=args.send_mass)
        cfg = engine_config(args, serve=serve, seed=args.seed, max_tokens=args.max_tokens)
        codec, drafter = _codec_and_drafter(args)
        token = Path(args.auth_token_file).read_text().strip() if args.auth_token_file else None
        root_cert = Path(args.tls_ca).read_bytes() if args.tls_ca else None
    except (ConfigError, ValueError, FileNotFoundError, OSError) as e:
        return fail(EXIT_USAGE, str(e))
    cfg = EngineConfig(**{**cfg.__dict__, "stop_ids": frozenset({codec.eos_id} - {None})})
    engine = EdgeEngine(lambda: channel(args.cloud, root_cert), codec.vocab_hash,
                        None if args.mode == "ar" else drafter, token)
    prompt = codec.encode(args.prompt)
    status = _Status(not args.json)
    stream = StreamDecoder(codec)

    def on_tokens(ids, stats):
        if not args.json:
            status.clear()
            sys.stdout.write(stream.feed(ids))
            sys.stdout.flush()
            status.show(stats)

    try:
        out, stats = asyncio.run(engine.generate(prompt, cfg, on_tokens))
    except ConnectionError as e:
        return fail(EXIT_UNREACHABLE, f"cannot reach the verifier at {args.cloud}: {e}")
    except grpc.aio.AioRpcError as e:
        return fail(EXIT_REFUSED, f"verifier refused the request ({e.code().name}): {e.details()}")
    figures = {**stats.as_dict(), "mode": args.mode, "depth": cfg.depth,
               "window": cfg.window, "adaptive": cfg.adaptive}
    if args.json:
        print(json.dumps({"text": codec.decode(out), "token_ids": out, "stats": figures}))
    else:
        status.clear()
        sys.stdout.write(stream.finish() + "\n")
        print(_summary(figures), file=sys.stderr)
    return 0


def _summary(f: dict) -> str:
    return (f"[{f['mode']}: {f['tokens']} tokens, {f['tokens_per_s']} tok/s, mean acceptance "
            f"length {f['mean_acceptance_length']}, {f['target_forwards_per_token']} target "
            f"forwards/token, wire {f['wire_bytes_up_per_token']} B/token up, "
            f"{f['wire_bytes_down_per_token']} B/token down, RTT {f['rtt_ms']} ms]")


class _Status:
    """A one-line live status on stderr (only on a terminal)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.t0, self.shown = time.perf_counter(), False

    def show(self, stats) -> None:
        if not self.enabled:
            return
        n = max(stats.tokens, 1)
        rate = stats.tokens / max(time.perf_counter() - self.t0, 1e-9)
        al = stats.tokens / stats.rounds if stats.rounds else 0.0
        rtt = f"{1000 * sorted(stats.round_trips)[len(stats.round_trips) // 2]:.0f} ms" \
            if stats.round_trips else "-"
        sys.stderr.write(f"\r\033[2K  … {stats.tokens} tok | {rate:.1f} tok/s | AL {al:.2f} | "
                         f"up {stats.wire_bytes_up / n:.1f} B/tok down "
                         f"{stats.wire_bytes_down / n:.1f} B/tok | RTT {rtt}")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[2K")
            self.shown = False


def build_service(args):
    """The EdgeService for `serve` (also used by tests)."""
    import asyncio  # noqa: F401 - the service's queue binds to the running loop lazily

    from acespec.edge.client import channel
    from acespec.edge.http_app import EdgeMetrics
    from acespec.edge.llama_drafter import LlamaDrafter, LlamaDrafterConfig
    from acespec.edge.server import EdgeService
    from acespec.edge.text import TextCodec
    from acespec.shared.served import ServeParams

    if not Path(args.drafter).is_file():
        raise FileNotFoundError(f"no drafter GGUF at {args.drafter}")
    drafter = LlamaDrafter(args.drafter, LlamaDrafterConfig(n_seq_max=40))
    token = Path(args.auth_token_file).read_text().strip() if args.auth_token_file else None
    root_cert = Path(args.tls_ca).read_bytes() if args.tls_ca else None
    base = engine_config(args, serve=ServeParams(send_mass=args.send_mass))
    return EdgeService(codec=TextCodec.from_drafter(drafter),
                       drafter=None if args.mode == "ar" else drafter,
                       connect=lambda: channel(args.cloud, root_cert),
                       model_name=args.model_name,
                       base=base, chat_template=drafter.chat_template(), token=token,
                       metrics=EdgeMetrics())


def run_serve(args) -> int:
    import uvicorn

    from acespec.edge.http_app import create_app

    try:
        svc = build_service(args)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"acespec edge serve: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"acespec edge listening on http://{args.host}:{args.port} (model "
          f"{args.model_name!r}, mode {args.mode}, verifier {args.cloud})", flush=True)
    # A request in flight must not hold SIGTERM hostage: after 5 s uvicorn cancels it.
    uvicorn.run(create_app(svc), host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=5)
    return 0
