"""Tensor parallelism on torch.distributed: rank 0 serves and schedules, every rank runs
the same pass on its shard (acespec.cloud.target.sharding).

Rank 0 plans each pass as usual (sessions, caches, block tables are its alone) and sends
the plan (`Pass`: ids, positions, and per sequence its pool rows and mask) to the other
ranks by broadcast, with the page-pool operations made since the last step (resizes, the
row copies of commits), so their pools of KV-head shards stay the same shape and content.
Then all ranks run the layers together: one all-reduce after the attention output and one
after the MLP. Only rank 0 applies the head.

Steps, broadcast by rank 0 and read in order by the others:
  ("pass", ops, Pass)   replay ops, run the pass
  ("ping", ops)         replay ops (sent every PING_S while idle: a lost rank shows at once)
  ("stop",)             leave the loop, exit 0

A rank that dies breaks the group: gloo and NCCL fail the next collective on every other
rank ("connection closed by peer"); rank 0 then reports it through `on_failure` and the
server stops; the other ranks exit 1.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from acespec.cloud.errors import Unavailable

log = logging.getLogger(__name__)

PING_S = 1.0  # rank 0's heartbeat while no pass runs
OP_TIMEOUT_S = 120  # the longest a rank waits in one collective


class GroupLost(Unavailable):
    """A tensor-parallel rank is gone: no pass can run any more."""


@dataclass(frozen=True)
class Topology:
    """Where this process sits, from torchrun's (or our own launcher's) environment."""

    rank: int
    world: int
    local_rank: int
    master: str | None = None  # "host:port" to meet at; None: MASTER_ADDR/MASTER_PORT

    @classmethod
    def from_env(cls) -> Topology | None:
        """None when this process is not a rank of a group (no WORLD_SIZE)."""
        if "WORLD_SIZE" not in os.environ:
            return None
        return cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                   int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))

    def device(self, requested: str) -> str:
        """cuda -> this rank's local GPU; cpu stays cpu."""
        if torch.device(requested).type == "cuda":
            return f"cuda:{self.local_rank}"
        return requested


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_group(topo: Topology, device: str) -> None:
    """Join the group: at topo.master, or by env:// (MASTER_ADDR, MASTER_PORT)."""
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend_for(device), rank=topo.rank, world_size=topo.world,
                            init_method=f"tcp://{topo.master}" if topo.master else "env://",
                            timeout=datetime.timedelta(seconds=OP_TIMEOUT_S))


def exchange(value: object) -> list[object]:
    """Every rank's value, in rank order (start-up checks)."""
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


class AllReduce:
    """The layers' reduce hook: sums partial outputs over the group, counting bytes."""

    def __init__(self) -> None:
        self.bytes = 0  # payload bytes this rank contributed, since start

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        self.bytes += x.numel() * x.element_size()
        return x


def attach(model, reduce: AllReduce) -> None:
    for layer in model.model.layers:
        layer.reduce = reduce


class Leader:
    """Rank 0's side: sends each pass (and the pool's ops) before running it, pings while
    idle, and reports a lost rank once through on_failure(reason)."""

    def __init__(self, model, on_failure: Callable[[str], None] | None = None, children=()):
        self.reduce = AllReduce()
        attach(model, self.reduce)
        self.on_failure = on_failure
        self.children = list(children)  # Popen of ranks this process started, if any
        self._lock = threading.Lock()  # one collective sequence at a time
        self._ops_lock = threading.Lock()
        self._ops: list[tuple] = []
        self.broken: str | None = None
        self.passes = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        model.tp = self
        model._pool = None  # the pool is made anew, reporting to record
        self._pinger = threading.Thread(target=self._ping_loop, name="tp-ping", daemon=True)
        self._pinger.start()

    def record(self, op: tuple) -> None:
        """The page pool's mirror: queued for the next step."""
        with self._ops_lock:
            self._ops.append(op)

    def _take_ops(self) -> list[tuple]:
        with self._ops_lock:
            ops, self._ops = self._ops, []
        return ops

    @contextlib.contextmanager
    def passing(self, step):
        """Around rank 0's own run of a pass: the other ranks get it first."""
        with self._lock:
            self._check()
            try:
                self._send(("pass", self._take_ops(), portable(step)))
                yield
            except Exception as e:
                self._fail(self._why(e))
                raise GroupLost(f"tensor parallelism lost: {self.broken}") from e
            self.passes += 1
            self._last = time.monotonic()

    def stop(self) -> None:
        """Tell the other ranks to exit, wait for the ones this process started."""
        from acespec.cloud.target.tp_launch import reap

        self._stop.set()
        with self._lock:
            if self.broken is None:
                with contextlib.suppress(Exception):
                    self._send(("stop",))
        reap(self.children)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()

    def _send(self, step: tuple) -> None:
        dist.broadcast_object_list([step], src=0)

    def _check(self) -> None:
        if self.broken is None:
            for r, child in enumerate(self.children, start=1):
                if child.poll() is not None:
                    self._fail(f"rank {r} exited ({_exit_text(child.returncode)})")
        if self.broken is not None:
            raise GroupLost(f"tensor parallelism lost: {self.broken}")

    def _why(self, e: BaseException) -> str:
        """The reason a collective failed: the rank this process started that died, when
        one did (it may take a moment to be reaped), else what the backend said."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for r, child in enumerate(self.children, start=1):
                if child.poll() is not None:
                    return f"rank {r} exited ({_exit_text(child.returncode)})"
            if not self.children:
                break
            time.sleep(0.05)
        return f"a collective failed ({_short(e)})"

    def _fail(self, reason: str) -> None:
        if self.broken is not None:
            return
        self.broken = reason
        log.error("tensor parallelism lost: %s; the verifier cannot run passes", reason)
        if self.on_failure:
            self.on_failure(reason)

    def _ping_loop(self) -> None:
        while not self._stop.wait(PING_S / 4):
            if self.broken is not None:
                return
            if time.monotonic() - self._last < PING_S or not self._lock.acquire(timeout=0):
                continue
            try:
                self._check()
                self._send(("ping", self._take_ops()))
                self._last = time.monotonic()
            except GroupLost:
                return
            except Exception as e:  # noqa: BLE001 - any failure of the group is the same news
                self._fail(self._why(e))
                return
            finally:
                self._lock.release()


def follow(model) -> int:
    """A rank other than 0: run what rank 0 sends until it says stop (exit code 0) or the
    group breaks (1)."""
    attach(model, AllReduce())
    pool = model.pool
    with torch.inference_mode():
        while True:
            box: list[object] = [None]
            try:
                dist.broadcast_object_list(box, src=0)
                step = box[0]
                for op in step[1] if len(step) > 1 else ():
                    pool.replay(op)
                if step[0] == "stop":
                    break
                if step[0] == "pass":
                    model.hidden(portable(step[2], model.device))
            except Exception as e:  # noqa: BLE001 - rank 0 or a peer is gone
                log.error("tensor-parallel rank %d: the group broke (%s); exiting",
                          dist.get_rank(), _short(e))
                return 1
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return 0


def portable(step, device: torch.device | str = "cpu"):
    """A copy of a Pass whose tensors own just their data, on `device` (a slice of a
    cache's row table would otherwise pickle the whole table, and a CUDA tensor would
    unpickle on rank 0's GPU)."""
    from acespec.cloud.target.kv_cache import SeqPass
    from acespec.cloud.target.model import Pass

    def own(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, copy=True)

    return Pass(own(step.ids), own(step.positions),
                [SeqPass(s.n, own(s.write_rows), own(s.read_rows), own(s.mask), s.last_only)
                 for s in step.seqs])


def _short(e: BaseException) -> str:
    """The gist of a backend's error: gloo's say which peer went how, in a long line."""
    text = str(e)
    m = re.search(r"Connection (?:reset|closed) by peer[^.]*|[Tt]imed out[^.]*", text)
    if m:
        return m.group(0).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:160]


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"
