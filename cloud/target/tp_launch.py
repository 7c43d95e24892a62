"""Starting a tensor-parallel verifier: ranks this process spawns (`cloud serve --tp N`) or
ranks torchrun started (`torchrun --nproc-per-node N -m acespec.cloud serve ...`).

Either way every rank sees RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, joins
the group first (so a rank that cannot load its shard can still say why), loads only its
shard, and the ranks compare what they loaded: a rank that failed, or that sees another
checkpoint, stops them all with one line naming it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import torch

from acespec.cloud.target.loader import checkpoint_files, load_model, set_threads
from acespec.cloud.target.packed import select_linear
from acespec.cloud.target.sharding import fingerprint
from acespec.cloud.target.tensor_parallel import (
    HEARTBEAT_TIMEOUT_S,
    Leader,
    Topology,
    beat_store,
    exchange,
    follow,
    init_group,
)
from acespec.procs import free_port, python_module, reap

log = logging.getLogger(__name__)

SPAWNED = "ACESPEC_TP_SPAWNED"  # set in the ranks `cloud serve --tp N` starts itself
TERM_GRACE_S = 30.0  # a rank told to stop by a signal leaves by then even if rank 0 is silent


def topology(tp: int | None) -> Topology | None:
    """This process's place in a group: torchrun's (or our spawner's) environment, else
    rank 0 of a group of `tp` to spawn, else None (one device). ValueError on a --tp that
    contradicts the environment."""
    env = Topology.from_env()
    if env is not None:
        if tp not in (None, env.world):
            raise ValueError(f"--tp {tp}, but this process is one of WORLD_SIZE={env.world} "
                             "ranks (torchrun --nproc-per-node): give the same number or "
                             "leave --tp out")
        return env if env.world > 1 else None
    if tp is None or tp == 1:
        return None
    return Topology(0, tp, 0)


def spawn_ranks(topo: Topology, worker_args: list[str]
                ) -> tuple[Topology, list[subprocess.Popen]]:
    """Start ranks 1..N-1 on this machine (`python -m acespec.cloud serve ...` with the
    group's environment); returns rank 0's topology with the meeting point, and their
    Popen. This process's environment is left as it was."""
    port = free_port()
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": str(topo.world), SPAWNED: str(os.getpid())}
    children = []
    for r in range(1, topo.world):
        env = {**base, "RANK": str(r), "LOCAL_RANK": str(r)}
        children.append(subprocess.Popen(
            [*python_module("acespec.cloud"), "serve", *worker_args], env=env))
    log.info("tensor parallelism: started ranks 1..%d (pids %s), rendezvous on 127.0.0.1:%d",
             topo.world - 1, ", ".join(str(c.pid) for c in children), port)
    return replace(topo, master=f"127.0.0.1:{port}"), children


def worker_args(model: str, dtype: str, device: str, threads: int,
                linear: str = "auto") -> list[str]:
    """What a spawned rank needs of rank 0's command line."""
    return ["--model", model, "--dtype", dtype, "--device", device, "--threads", str(threads),
            "--kernels", "torch", "--linear", linear]


def load_rank(path: str | Path, dtype: str, device: str, threads: int, topo: Topology,
              linear: str = "auto"):
    """Join the group, load this rank's shard (its linears as `--linear` says), and check
    the ranks agree: the model, or ValueError naming the rank that failed or differs
    (raised on every rank)."""
    init_group(topo, device)
    model, mine = None, ""
    try:
        model = load_model(path, dtype=dtype, device=device, rank=topo.rank, world=topo.world)
        set_threads(model, threads, share=topo.world)
        select_linear(linear, model)
        mine = fingerprint(Path(path), checkpoint_files(Path(path)))
    except Exception as e:  # noqa: BLE001 - reported through the group, below
        mine = f"error: {type(e).__name__}: {e}"
    prints = exchange((str(Path(path).resolve()), mine))
    problem = _unfit(prints)
    if problem:
        raise ValueError(problem)
    return model


def _unfit(prints: list[tuple[str, str]]) -> str | None:
    """Why the ranks cannot serve together, from each rank's (checkpoint path, fingerprint
    or error): one line, or None."""
    for r, (where, what) in enumerate(prints):
        if what.startswith("error: "):
            return f"tensor-parallel rank {r} could not load {where}: {what[7:]}"
    if len({what for _, what in prints}) > 1:
        seen = "; ".join(f"rank {r}: {where} ({what})" for r, (where, what) in enumerate(prints))
        return ("the tensor-parallel ranks see different checkpoints (config.json or "
                f"safetensors headers differ): {seen}")
    return None


def check_kernels(kernels: str, world: int) -> None:
    """ValueError (one line) for kernels a group of `world` ranks cannot run."""
    if world > 1 and kernels == "triton":
        raise ValueError(f"--tp {world} with --kernels triton: tensor-parallel passes run the "
                         "torch attention path (the Triton tree attention is not sharded); "
                         "use --kernels torch or auto")


def start_leader(path: str | Path, topo: Topology, dtype: str, device: str, threads: int,
                 on_failure=None, linear: str = "auto",
                 heartbeat_s: float = HEARTBEAT_TIMEOUT_S):
    """Rank 0 of a group: start ranks 1..N-1 here unless torchrun did (topo from the
    environment), load this rank's shard and lead the others, watching their heartbeats
    (a rank silent for heartbeat_s is lost). The sharded model; the ranks this process
    started are reaped if loading fails."""
    children = []
    if Topology.from_env() is None:
        topo, children = spawn_ranks(topo, worker_args(str(path), dtype, device, threads, linear))
    try:
        model = load_rank(path, dtype, topo.device(device), threads, topo, linear)
        beats = beat_store(topo)
    except BaseException:
        reap(children)  # they stop on the same error
        raise
    Leader(model, on_failure, children, beats, heartbeat_s)
    return model


@contextlib.contextmanager
def local_group(path: str | Path, n: int, dtype: str = "float32", device: str = "cpu",
                threads: int = 0, on_failure=None, linear: str = "auto",
                heartbeat_s: float = HEARTBEAT_TIMEOUT_S):
    """This process as rank 0 of n ranks on this machine (the others spawned), yielding
    the sharded model; the ranks are stopped after (profiles and tests; `cloud serve --tp`
    starts its group the same way, around a server)."""
    saved = torch.get_num_threads()
    try:
        model = start_leader(path, Topology(0, n, 0), dtype, device, threads, on_failure,
                             linear, heartbeat_s)
    except BaseException:
        torch.set_num_threads(saved)
        raise
    try:
        yield model
    finally:
        torch.set_num_threads(saved)
        model.tp.stop()


def serve_rank(path: str, dtype: str, device: str, threads: int, topo: Topology,
               linear: str = "auto") -> int:
    """A rank other than 0: load, then run rank 0's passes until it stops. Exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: rank 0 drains first
    signal.signal(signal.SIGTERM, _leave_soon)
    for handler in logging.getLogger().handlers:  # say which rank speaks
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s rank {topo.rank} %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    try:
        model = load_rank(path, dtype, device, threads, topo, linear)
    except ValueError as e:
        if topo.rank == 1:  # one line is enough; rank 0 prints it too
            log.debug("%s", e)
        exit_in_group(2)
    log.info("tensor-parallel rank %d of %d ready", topo.rank, topo.world)
    return follow(model, beat_store(topo))


def exit_in_group(code: int) -> None:
    """Exit now with `code` from a process that joined a group that did not start: Python's
    own exit tears down the group's threads and may abort (SIGABRT) instead of returning
    the code, even after destroy_process_group. Output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leave_soon(signum, frame) -> None:
    """SIGTERM (torchrun's, on shutdown): rank 0 drains and says stop; leave by
    TERM_GRACE_S in any case."""
    timer = threading.Timer(TERM_GRACE_S, os._exit, args=(0,))
    timer.daemon = True
    timer.start()
