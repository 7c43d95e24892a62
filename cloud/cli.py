"""`acespec cloud ...` argument parsing (imports the server lazily)."""

from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("cloud", help="the cloud verifier (gRPC)")
    csub = p.add_subparsers(dest="cloud_cmd", required=True, metavar="COMMAND")
    s = csub.add_parser(
        "serve", help="serve a target model as a gRPC verifier",
        description="Load a Hugging Face checkpoint (Llama/Qwen2/Qwen3) and serve the AceSpec "
        "verifier: tree scoring sessions, cloud-only Generate, gRPC health. SIGINT/SIGTERM "
        "drain open sessions before exit.")
    s.add_argument("--model", default="", help="HF checkpoint folder (default: the demo target)")
    s.add_argument("--host", default="0.0.0.0", help="bind address (default: %(default)s)")
    s.add_argument("--port", type=int, default=50051, help="gRPC port, 0 = any (default: %(default)s)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    s.add_argument("--device", default="cpu", help="torch device, e.g. cuda:0 (default: cpu)")
    s.add_argument("--auth-token-file", help="file with one accepted bearer token per line")
    s.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key)")
    s.add_argument("--tls-key", help="PEM private key (with --tls-cert)")
    s.add_argument("--max-sessions", type=int, default=256)
    s.add_argument("--max-live-nodes", type=int, default=256, help="uncommitted nodes per session")
    s.add_argument("--max-prompt-tokens", type=int, default=4096)
    s.add_argument("--idle-timeout", type=float, default=300.0, help="seconds (default: %(default)s)")
    s.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    s.add_argument("--emulate-step-ms", metavar="T0[,PER_NODE]",
                   help="TESTBED: add T0 ms (+ PER_NODE ms per node) to every forward pass, "
                   "to emulate a big model's step time on a small target")
    s.add_argument("--grace", type=float, default=10.0, help="shutdown drain seconds")
    s.set_defaults(func=run_serve)


def _tokens(path: str | None) -> frozenset[str]:
    if not path:
        return frozenset()
    tokens = frozenset(t.strip() for t in Path(path).read_text().splitlines() if t.strip())
    if not tokens:
        raise ValueError(f"{path} holds no tokens")
    return tokens


def run_serve(args) -> int:
    import asyncio

    from acespec.cloud.batcher import StepEmulation
    from acespec.cloud.engine import Limits
    from acespec.cloud.server import ServerConfig, serve

    try:
        cfg = ServerConfig(
            model=args.model, host=args.host, port=args.port, dtype=args.dtype,
            device=args.device, idle_timeout_s=args.idle_timeout,
            limits=Limits(max_sessions=args.max_sessions, max_live_nodes=args.max_live_nodes,
                          max_prompt_tokens=args.max_prompt_tokens),
            auth_tokens=_tokens(args.auth_token_file), tls_cert=args.tls_cert,
            tls_key=args.tls_key, metrics_port=args.metrics_port,
            emulation=StepEmulation.parse(args.emulate_step_ms), grace_s=args.grace)
        asyncio.run(serve(cfg))
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"acespec cloud serve: error: {e}", file=sys.stderr)
        return 2
    return 0
