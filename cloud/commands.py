"""The verifier's commands, once `acespec cloud ...` has parsed them (acespec.cloud.cli):
serve (on one device, or as a rank of a tensor-parallel group) and profile.
Imports torch; the parser imports this module only when a command runs."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import torch.distributed as dist

from acespec import pairs
from acespec.cloud.serving.server import ServeFailed, ServerConfig, serve
from acespec.cloud.target import profile
from acespec.cloud.target.config import ModelArgs
from acespec.cloud.target.sharding import check_tp
from acespec.cloud.target.tp_launch import check_kernels, exit_in_group, serve_rank, topology
from acespec.cloud.verify.batcher import StepEmulation
from acespec.cloud.verify.engine import Limits
from acespec.cloud.verify.gap import DraftEmulation
from acespec.models import DEMO_TARGET


def run_serve(args) -> int:
    topo = None
    try:
        pairs.apply(args)
        topo = _check_tp(args)
        if topo is not None and topo.rank != 0:
            return serve_rank(args.model or _demo_target(), args.dtype,
                              topo.device(args.device), args.threads, topo, args.linear)
        cfg = ServerConfig(
            model=args.model, host=args.host, port=args.port, dtype=args.dtype,
            device=args.device, threads=args.threads, linear=args.linear,
            idle_timeout_s=args.idle_timeout,
            write_timeout_s=args.write_timeout,
            limits=Limits(max_sessions=args.max_sessions, max_live_nodes=args.max_live_nodes,
                          max_prompt_tokens=args.max_prompt_tokens, propose=args.propose),
            auth_tokens=_tokens(args.auth_token_file), tls_cert=args.tls_cert,
            tls_key=args.tls_key, metrics_port=args.metrics_port,
            emulation=StepEmulation.parse(args.emulate_step_ms, args.emulate_dilate),
            grace_s=args.grace,
            kernels=args.kernels, tp=topo.world if topo else 1, gap_drafter=args.gap_drafter,
            cloud_draft=DraftEmulation.parse(args.emulate_cloud_draft_ms),
            tp_heartbeat_s=args.tp_heartbeat_timeout)
        asyncio.run(serve(cfg))
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"acespec cloud serve: error: {e}", file=sys.stderr)
        if topo is not None and _in_group():
            exit_in_group(2)
        return 2
    except ServeFailed as e:
        print(f"acespec cloud serve: error: {e}", file=sys.stderr)
        return 1
    return 0


def _in_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def _demo_target() -> str:
    return str(DEMO_TARGET)


def _check_tp(args):
    """This process's tensor-parallel topology (None: one device), after the checks that
    need no other rank: ValueError (one line) on a bad --tp."""
    topo = topology(args.tp)
    if topo is None:
        return None
    check_kernels(args.kernels, topo.world)  # every rank, before any waits for the others

    path = args.model or _demo_target()
    check_tp(ModelArgs.from_dir(path), topo.world, where=Path(path).name)
    return topo


def run_profile(args) -> int:
    try:
        pairs.apply(args)
        if args.random:
            if args.random not in profile.SHAPES:
                raise ValueError(f"--random {args.random!r}: shapes are "
                                 f"{', '.join(sorted(profile.SHAPES))}")
            if args.tp != [1]:
                raise ValueError("--random runs on one device: give --tp 1 (the ranks of a "
                                 "group load their shards from a checkpoint)")
        else:
            path = args.model or _demo_target()
            for tp in args.tp:
                check_tp(ModelArgs.from_dir(path), tp, where=Path(path).name)
        rows = profile.run(args.model or _demo_target(), args.random, args.tp, args.nodes,
                           args.context, args.repeats, args.dtype, args.device, args.threads,
                           args.linear)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"acespec cloud profile: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(profile.as_dicts(rows), indent=2) if args.json else profile.markdown(rows))
    return 0


def _tokens(path: str | None) -> frozenset[str]:
    if not path:
        return frozenset()
    tokens = frozenset(t.strip() for t in Path(path).read_text().splitlines() if t.strip())
    if not tokens:
        raise ValueError(f"{path} holds no tokens")
    return tokens
