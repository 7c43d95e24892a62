"""`acespec cloud ...` argument parsing; `serve` and `profile` run in acespec.cloud.commands,
imported when one runs (it needs torch, and `acespec --help` does not)."""

from __future__ import annotations

import argparse
import json
import sys

from acespec import pairs
from acespec.argtypes import command, command_group, number
from acespec.cloud.serving.nginx import nginx_config
from acespec.shared.tokenizer import ModelFileError


def add_parser(sub) -> None:
    csub = command_group(sub, "cloud", "the cloud verifier (gRPC)")
    s = csub.add_parser(
        "serve", help="serve a target model as a gRPC verifier",
        description="Load a Hugging Face checkpoint (Llama/Qwen2/Qwen3) and serve the AceSpec "
        "verifier: tree scoring sessions, cloud-only Generate, gRPC health. SIGINT/SIGTERM "
        "drain open sessions before exit.")
    _target_flags(s)
    s.add_argument("--host", default="0.0.0.0", help="bind address (default: %(default)s)")
    s.add_argument("--port", type=port_number, default=50051,
                   help="gRPC port, 0 = any (default: %(default)s)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    s.add_argument("--device", default="cpu", help="torch device, e.g. cuda:0 (default: cpu)")
    s.add_argument("--kernels", default="auto", choices=["auto", "triton", "torch"],
                   help="tree attention + served encoder: Triton kernels or the torch "
                   "reference (default auto: Triton on CUDA when installed; logged at start)")
    s.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default 0: 1 for models under 50M parameters)")
    _linear_flag(s)
    s.add_argument("--tp", type=number(int, 1, 1024), metavar="N",
                   help="tensor parallelism: shard the target over N ranks (torch.distributed; "
                   "gloo on CPU, NCCL on CUDA, one GPU per rank), started by this command; "
                   "under torchrun the ranks are torchrun's and N may be left out. N must "
                   "divide the model's KV and query heads (default: 1)")
    s.add_argument("--tp-heartbeat-timeout", type=number(float, 1.0), default=5.0, metavar="S",
                   help="with --tp: a rank whose heartbeat stops this long (SIGSTOP, a hang), "
                   "or that takes no step rank 0 sent that long ago, is lost: health goes "
                   "NOT_SERVING, sessions end with UNAVAILABLE naming it, the ranks are "
                   "killed and the server exits 1; a pass in which no rank progresses for 6x "
                   "this is hung alike (default: %(default)s)")
    s.add_argument("--auth-token-file", help="file with one accepted bearer token per line")
    s.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key)")
    s.add_argument("--tls-key", help="PEM private key (with --tls-cert)")
    s.add_argument("--max-sessions", type=int, default=256)
    s.add_argument("--max-live-nodes", type=int, default=256, help="uncommitted nodes per session")
    s.add_argument("--max-prompt-tokens", type=int, default=4096)
    s.add_argument("--propose", type=number(int, 0, 64), default=8, metavar="N",
                   help="greedy/coupled sessions: in a pass no edge draft covers, score up to "
                   "N tokens the verifier proposes itself from the session's text (prompt "
                   "lookup), as many as its measured acceptance and pass cost say pay; "
                   "output is unchanged, only passes are saved; 0 turns it off "
                   "(default: %(default)s)")
    s.add_argument("--gap-drafter", metavar="PATH", default="",
                   help="a small drafter with the target's tokenizer (.gguf, e.g. the edge's "
                   "own drafter file, or an HF checkpoint folder), run here with torch: in "
                   "a pass no edge draft covers, it proposes (up to --propose tokens) instead of "
                   "prompt lookup. Output is unchanged; it costs its own decoding before "
                   "each such pass (default: none)")
    s.add_argument("--emulate-cloud-draft-ms", metavar="T0[,PER_SEQ]", default="",
                   help="TESTBED: pad each batched step of --gap-drafter to T0 ms (+ PER_SEQ "
                   "ms per session in the batch), a co-located draft model's step on the "
                   "target's device; drafting runs between the target's passes either way "
                   "(default: its real decode only)")
    s.add_argument("--idle-timeout", type=float, default=300.0, help="seconds (default: %(default)s)")
    s.add_argument("--write-timeout", type=number(float, 0, lo_open=True), default=30.0,
                   help="end a session whose client has read nothing for this many seconds "
                   "while the downlink is full (default: %(default)s)")
    s.add_argument("--metrics-port", type=port_number,
                   help="serve Prometheus metrics on this port (bound to --host)")
    s.add_argument("--emulate-step-ms", metavar="T0[,PER_NODE[,KNEE]]",
                   help="TESTBED: every pass of the target lasts T0 ms (+ PER_NODE ms per "
                   "node, or per node beyond KNEE nodes: a GPU-like roofline, flat up to the "
                   "knee), the small target's real compute inside it, to emulate a big "
                   "model's step time on its device")
    s.add_argument("--emulate-dilate", metavar="K", type=number(float, 1, 100), default=1.0,
                   help="TESTBED: a time-dilated run (as `bench load --dilate K` starts): "
                   "the scheduler's own wall-clock windows (the gather after a pass, how "
                   "long a session or client counts as recent, a prefill pass's time bound) "
                   "x K, as --emulate-step-ms gives the device's step x K (default: 1)")
    s.add_argument("--grace", type=float, default=10.0, help="shutdown drain seconds")
    s.set_defaults(func=command(_commands, "run_serve"))
    lt = csub.add_parser(
        "loadtest", help="measure a verifier on loopback: nodes/s, latency, wire bytes",
        description="Start a verifier on loopback and run concurrent greedy and sampled "
        "sessions through a byte-counting proxy. Checks every greedy session against "
        "cloud-only Generate. Prints a markdown table (or JSON with --json).")
    lt.add_argument("--model", default="", help="HF checkpoint folder (default: the demo target)")
    lt.add_argument("--rounds", type=int, default=20, help="Extend+Commit rounds per session")
    lt.add_argument("--depth", type=int, default=4, help="nodes per Extend")
    lt.add_argument("--sessions", default="greedy:1,greedy:8,greedy:64,sampled:1,sampled:8",
                    help="scenarios MODE:N, comma-separated (default: %(default)s)")
    lt.add_argument("--emulate-step-ms", metavar="T0[,PER_NODE]", help="as for `serve`")
    lt.add_argument("--json", action="store_true")
    lt.set_defaults(func=run_loadtest)
    pr = csub.add_parser(
        "profile", help="pass time vs nodes scored, one device and tensor-parallel side by side",
        description="Time a pass of the target (a chain of N new nodes after a "
        "--context-token prefix, as the batcher runs it) for each --nodes and each --tp, "
        "with the all-reduce bytes a pass moves. Prints a markdown table (or JSON).")
    _target_flags(pr)
    pr.add_argument("--random", metavar="SHAPE",
                    help="a random-weight model of a named shape instead of a checkpoint: "
                    "llama-8b, llama-1b or tiny (one device: --tp 1)")
    pr.add_argument("--tp", type=_int_list, default=[1, 2], metavar="N[,N...]",
                    help="tensor-parallel sizes, side by side (default: 1,2)")
    pr.add_argument("--nodes", type=_int_list, default=[1, 4, 16, 64], metavar="N[,N...]",
                    help="nodes per pass (default: 1,4,16,64)")
    pr.add_argument("--context", type=number(int, 1, 1 << 16), default=256,
                    help="prefix tokens in the KV cache (default: %(default)s)")
    pr.add_argument("--repeats", type=number(int, 1, 10000), default=20,
                    help="timed passes per point, after 2 warm-ups (default: %(default)s)")
    pr.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    pr.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    pr.add_argument("--threads", type=int, default=0, help="as for `serve`")
    _linear_flag(pr)
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=command(_commands, "run_profile"))
    ng = csub.add_parser("nginx-config", help="print an nginx config balancing verifier replicas",
                         description="nginx (grpc_pass) in front of verifier replicas, with a "
                         "consistent hash on the x-acespec-session metadata so sessions stick.")
    ng.add_argument("replicas", nargs="+", metavar="HOST:PORT")
    ng.add_argument("--listen", default="0.0.0.0:50051")
    ng.add_argument("--prefix", default="/var/lib/acespec-nginx", help="pid/log/temp folder")
    ng.set_defaults(func=run_nginx_config)


def _target_flags(p) -> None:
    p.add_argument("--model", default="", help="HF checkpoint folder (default: the demo target)")
    pairs.add_argument(p, target="model")


def _int_list(text: str) -> list[int]:
    """argparse type: '1,4,16' -> [1, 4, 16], each >= 1."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "positive integers")
    return values


def _linear_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--linear", default="auto", choices=["auto", "onednn", "torch"],
                   help="linear layers: oneDNN with weights prepacked at load (a CPU pass "
                   "then costs about the same for 1 to 8 tokens), or torch's F.linear "
                   "(default auto: oneDNN on the CPU where torch has it; logged at start)")


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (larger numbers would wrap silently)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)")
    return port


def _commands():
    """acespec.cloud.commands (serve, profile), imported when one runs."""
    from acespec.cloud import commands  # lazy: torch, loaded only when a command runs

    return commands


def run_loadtest(args) -> int:
    # lazy: torch, and the edge's client that drives the verifier (the cloud imports none)
    from acespec.sim.loadtest import markdown, measure

    try:
        scenarios = [(m, int(n)) for m, n in (x.split(":") for x in args.sessions.split(","))]
        if any(m not in ("greedy", "sampled") or n < 1 for m, n in scenarios):
            raise ValueError
    except ValueError:
        print(f"acespec cloud loadtest: error: --sessions wants MODE:N,... with MODE greedy or "
              f"sampled, got {args.sessions!r}", file=sys.stderr)
        return 2
    try:
        rows = measure(args.model, args.rounds, args.depth, scenarios, args.emulate_step_ms)
    except ModelFileError as e:  # --model's files, at load
        print(f"acespec cloud loadtest: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))
    bad = [r for r in rows if r["correct"] not in ("n/a", f"{r['sessions']}/{r['sessions']}")]
    return 1 if bad else 0


def run_nginx_config(args) -> int:
    print(nginx_config(args.replicas, args.listen, args.prefix))
    return 0
