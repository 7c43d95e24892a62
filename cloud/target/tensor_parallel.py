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
rank ("connection closed by peer"). A rank that stops answering without dying (SIGSTOP, a
hang) would hold every other rank in a collective until the backend's timeout, so each rank
other than 0 writes a heartbeat to the group's rendezvous store from a thread of its own
(its count, and the steps and all-reduces it has completed), and rank 0 watches them
(`verdict`): a rank is lost when its heartbeat stops for the heartbeat timeout, when it
has not taken a step sent that long ago, or when a pass makes no progress on any rank for
STALL_FACTOR timeouts. Either way rank 0 kills the ranks it started (which also fails the
collective its pass waits in), reports the reason once through `on_failure`, and the
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from acespec.cloud.errors import Unavailable
from acespec.cloud.target.kv_cache import SeqPass
from acespec.cloud.target.model import Pass
from acespec.procs import reap

log = logging.getLogger(__name__)

PING_S = 1.0  # rank 0's step while no pass runs (the other ranks wait for steps)
OP_TIMEOUT_S = 120  # the longest a rank waits in one collective
BEAT_S = 0.5  # how often a rank other than 0 writes its heartbeat
HEARTBEAT_TIMEOUT_S = 5.0  # a rank silent this long is lost (cloud serve --tp-heartbeat-timeout)
STALL_FACTOR = 6  # a pass in which no rank progresses for this many heartbeat timeouts hung
BEATS = "acespec/beat"  # the heartbeats' key prefix in the rendezvous store
STOP_WAIT_S = 2.0  # how long stop() waits for a pass to leave a broken group's collective


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


@dataclass
class RankState:
    """What rank 0 last read of one other rank's heartbeat; times on rank 0's clock."""

    alive_at: float  # when its beat last changed
    moved_at: float  # when its progress (taken, reduces) last changed
    beat: str = ""  # "<pid>.<count>": changes every BEAT_S while the rank's process runs
    taken: int = 0  # steps it has taken (passes and pings)
    reduces: int = 0  # all-reduces it has completed

    def observe(self, text: str, now: float) -> None:
        """A heartbeat as `beat` writes it: "<pid>.<count> <taken> <reduces>"."""
        beat, taken, reduces = text.split()
        if beat != self.beat:
            self.beat, self.alive_at = beat, now
        if (int(taken), int(reduces)) != (self.taken, self.reduces):
            self.taken, self.reduces, self.moved_at = int(taken), int(reduces), now


def verdict(now: float, timeout_s: float, ranks: Mapping[int, RankState],
            sent_at: Mapping[int, float], busy_since: float | None, own_moved_at: float
            ) -> str | None:
    """Which rank stopped answering and for how long (None: all answer), from rank 0's
    reading of the heartbeats (seconds on rank 0's clock). sent_at: step number -> when
    rank 0 sent it, for steps some rank has not taken; busy_since: when the pass now
    running began (None: idle); own_moved_at: when rank 0 last completed a step or an
    all-reduce. A heartbeat is up to BEAT_S old when read, which the timeout covers."""
    for r, s in ranks.items():
        if now - s.alive_at > timeout_s:
            return f"rank {r} stopped answering (no heartbeat for {now - s.alive_at:.1f} s)"
    for r, s in ranks.items():  # a live rank takes each step within milliseconds of it;
        # one whose last beat was written before the step was sent may just be stopped
        due = sent_at.get(s.taken + 1)
        if due is not None and now - due > timeout_s and s.alive_at - due > BEAT_S:
            return (f"rank {r} stopped answering (its heartbeat runs, but it has not taken "
                    f"step {s.taken + 1} for {now - due:.1f} s)")
    if busy_since is not None:  # every rank in the pass, none moving: a hung collective
        moved = max(busy_since, own_moved_at, *(s.moved_at for s in ranks.values()))
        if now - moved > STALL_FACTOR * timeout_s:
            return f"a pass made no progress on any rank for {now - moved:.1f} s"
    return None


def beat_store(topo: Topology, timeout_s: float = OP_TIMEOUT_S) -> dist.Store:
    """A client of the group's rendezvous store (rank 0's, or torchrun's agent's), its keys
    under BEATS, for the heartbeats (a connection of their own: no collective shares it)."""
    where = topo.master or f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    host, port = where.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return dist.PrefixStore(BEATS, store)


def beat(store: dist.Store, rank: int, progress: Callable[[], tuple[int, int]],
         stop: threading.Event) -> None:
    """A rank's heartbeat (a thread of its own): "<pid>.<count> <taken> <reduces>" every
    BEAT_S until stop. A store write does not wait for an answer, so this never blocks on
    rank 0; a stopped process (SIGSTOP) stops this thread with the others, and rank 0
    sees the silence."""
    me, n = os.getpid(), 0
    while True:
        n += 1
        taken, reduces = progress()
        try:
            store.set(str(rank), f"{me}.{n} {taken} {reduces}")
        except Exception:  # noqa: BLE001 - the store left with rank 0: the main loop reports
            return
        if stop.wait(BEAT_S):
            return


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
        self.calls = 0  # all-reduces completed (the heartbeat's progress)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        self.bytes += x.numel() * x.element_size()
        self.calls += 1
        return x


def attach(model, reduce: AllReduce) -> None:
    for layer in model.model.layers:
        layer.reduce = reduce


class Leader:
    """Rank 0's side: sends each pass (and the pool's ops) before running it, pings while
    idle, watches the other ranks' heartbeats (from `beats`, a beat_store), and reports a
    lost rank once through on_failure(reason), after killing the ranks it started."""

    def __init__(self, model, on_failure: Callable[[str], None] | None = None, children=(),
                 beats: dist.Store | None = None,
                 heartbeat_s: float = HEARTBEAT_TIMEOUT_S):
        self.reduce = AllReduce()
        attach(model, self.reduce)
        self.on_failure = on_failure
        self.children = list(children)  # Popen of ranks this process started, if any
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()  # one collective sequence at a time
        self._ops_lock = threading.Lock()
        self._ops: list[tuple] = []
        self.broken: str | None = None
        self.passes = 0
        self.sent = 0  # steps broadcast (passes and pings)
        self._sent_at: dict[int, float] | None = {} if beats else None  # step -> when sent,
        # until every rank took it (watched groups only)
        self._busy_since: float | None = None  # when the pass now running began
        self._last = time.monotonic()
        self._stop = threading.Event()
        model.tp = self
        model._pool = None  # the pool is made anew, reporting to record
        self._pinger = threading.Thread(target=self._ping_loop, name="tp-ping", daemon=True)
        self._pinger.start()
        if beats is not None:
            threading.Thread(target=self._watch_loop, args=(beats,), name="tp-watch",
                             daemon=True).start()

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
            self._busy_since = time.monotonic()
            try:
                self._send(("pass", self._take_ops(), portable(step)))
                yield
            except Exception as e:
                self._fail(self._why(e))
                raise GroupLost(f"tensor parallelism lost: {self.broken}") from e
            finally:
                self._busy_since = None
            self.passes += 1
            self._last = time.monotonic()

    def stop(self) -> None:
        """Tell the other ranks to exit, wait for the ones this process started."""
        if self.broken is None:  # else a pass may hold the lock, stuck in a collective
            with self._lock:  # (one stuck on a rank not yet found: the watch still runs)
                self._stop.set()
                if self.broken is None:
                    with contextlib.suppress(Exception):
                        self._send(("stop",))
        self._stop.set()
        reap(self.children)
        if self._lock.acquire(timeout=STOP_WAIT_S):  # else a pass is stuck in a collective
            try:  # with ranks this process could not kill (torchrun's): the exit ends it
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()
            finally:
                self._lock.release()

    def _send(self, step: tuple) -> None:
        self.sent += 1
        if self._sent_at is not None:
            self._sent_at[self.sent] = time.monotonic()
        dist.broadcast_object_list([step], src=0)

    def _check(self) -> None:
        if self.broken is None and (exited := self._exited()):
            self._fail(exited)
        if self.broken is not None:
            raise GroupLost(f"tensor parallelism lost: {self.broken}")

    def _exited(self) -> str | None:
        for r, child in enumerate(self.children, start=1):
            if child.poll() is not None:
                return f"rank {r} exited ({_exit_text(child.returncode)})"
        return None

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
        for child in self.children:  # no orphans; a collective waiting on one fails now
            if child.poll() is None:
                with contextlib.suppress(OSError):
                    child.kill()
        if self.on_failure:
            self.on_failure(reason)

    def _watch_loop(self, beats: dist.Store) -> None:
        """Read the other ranks' heartbeats every BEAT_S / 2; fail the group on a verdict."""
        start = time.monotonic()
        ranks = {r: RankState(start, start) for r in range(1, dist.get_world_size())}
        own, own_moved = (0, 0), start
        while not self._stop.wait(BEAT_S / 2) and self.broken is None:
            try:
                texts = {r: beats.get(str(r)).decode() for r in ranks if beats.check([str(r)])}
            except Exception as e:  # noqa: BLE001 - the store is gone (torchrun's agent)
                if not self._stop.is_set():
                    self._fail(f"the group's rendezvous store failed ({_short(e)})")
                return
            now = time.monotonic()
            for r, text in texts.items():
                ranks[r].observe(text, now)
            if (self.sent, self.reduce.calls) != own:
                own, own_moved = (self.sent, self.reduce.calls), now
            taken = min(s.taken for s in ranks.values())
            for k in list(self._sent_at):  # a copy: the pass thread adds steps meanwhile
                if k <= taken:
                    del self._sent_at[k]
            reason = self._exited() or verdict(now, self.heartbeat_s, ranks,
                                               dict(self._sent_at), self._busy_since,
                                               own_moved)
            if reason:
                self._fail(reason)
                return

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


def follow(model, beats: dist.Store | None = None) -> int:
    """A rank other than 0: run what rank 0 sends until it says stop (exit code 0) or the
    group breaks (1), writing its heartbeat to `beats` (a beat_store) meanwhile."""
    reduce, taken, stop = AllReduce(), 0, threading.Event()
    attach(model, reduce)
    if beats is not None:
        threading.Thread(target=beat, args=(beats, dist.get_rank(),
                                            lambda: (taken, reduce.calls), stop),
                         name="tp-beat", daemon=True).start()
    pool = model.pool
    try:
        with torch.inference_mode():
            while True:
                box: list[object] = [None]
                try:
                    dist.broadcast_object_list(box, src=0)
                    taken += 1
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
    finally:
        stop.set()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return 0


def portable(step, device: torch.device | str = "cpu"):
    """A copy of a Pass whose tensors own just their data, on `device` (a slice of a
    cache's row table would otherwise pickle the whole table, and a CUDA tensor would
    unpickle on rank 0's GPU)."""
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
