"""Runs the target for many sessions: pending requests are scored together in one forward
pass, one pass at a time, in a worker thread so the event loop keeps serving streams. A
pass takes a bounded chunk of each request (docs/design.md §3): a session's earned share
of nodes within its client's part of the pass (acespec.cloud.verify.clients), and of a
prompt what the pass's prefill budget allows."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from weakref import WeakKeyDictionary

import torch

from acespec.argtypes import ms_profile
from acespec.cloud.errors import Unavailable
from acespec.cloud.target.kv_cache import KVCache
from acespec.cloud.target.model import Request, Transformer
from acespec.cloud.verify.clients import RECENT_S as CLIENT_RECENT_S
from acespec.cloud.verify.clients import ClientLoad, fair_level, in_turn
from acespec.cloud.verify.proposals import PassCost

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepEmulation:
    """Testbed knob: every forward pass lasts a big model's step time. Per node either
    from the first node (`T0,PER_NODE`: a CPU-like, per-node-heavy step) or beyond a knee
    (`T0,PER_NODE,KNEE`: a GPU-like roofline, flat up to KNEE nodes, then linear)."""

    base_ms: float = 0.0  # per pass
    per_node_ms: float = 0.0  # per scored node (beyond the knee)
    knee: int = 0  # nodes a pass scores for base_ms alone
    dilate: float = 1.0  # a time-dilated testbed: the scheduler's own windows x this too

    @classmethod
    def parse(cls, text: str | None, dilate: float = 1.0) -> StepEmulation:
        """'T0', 'T0,PER_NODE' or 'T0,PER_NODE,KNEE' in milliseconds (KNEE in nodes), as
        given (already dilated); dilate: the factor the scheduler's windows take."""
        if not 1 <= dilate <= 100:
            raise ValueError(f"--emulate-dilate must be in [1, 100], got {dilate:g}")
        if not text:
            return cls(dilate=dilate)
        base, per_node, knee = ms_profile(
            text, "T0[,PER_NODE[,KNEE]] >= 0 (KNEE a whole number of nodes)", 3,
            flag="--emulate-step-ms", whole_third=True)
        return cls(base, per_node, int(knee), dilate)

    def seconds(self, n_nodes: int) -> float:
        return (self.base_ms + self.per_node_ms * max(0, n_nodes - self.knee)) / 1000


@dataclass
class PassStats:
    sessions: int
    nodes: int
    seconds: float
    prefill: int = 0  # of the nodes, prompt tokens (chunks of prefills)
    prefills: int = 0  # of the requests, chunks of prompts
    waits: tuple[float, ...] = ()  # seconds each request this pass starts had waited
    clients: dict[str, int] = field(default_factory=dict)  # nodes per client in the pass
    turnaround: float = 0.0  # seconds from the last pass's end to this one's start, while
    # its sessions queued again and this pass was planned (0: it started on a new request)


PREFILL_SLACK = 0.25  # a prefill chunk may make a pass with other sessions this much longer
# (more for new clients' short prompts: Batcher._prefill_budget)
PREFILL_MIN = 16  # ... but always carries this many prompt tokens
PREFILL_ALONE_S = 0.25  # with no other session decoding, a prefill pass's most seconds (and
# with others, a pass's most for new clients' prompts)
RECENT_S = 1.0  # a sequence scored this recently counts as decoding: a prefill yields to it
GATHER_S = 0.01  # after a pass, wait for the sequences that come straight back (a decided
# session's next pass) while they keep coming, each within this long of the one before, up
# to GATHER_SHARE of the pass, so the next pass holds them too instead of running without
# them and making them wait a whole pass: the sessions that were in a pass must not split
# into cohorts that take turns
GATHER_SHARE = 1.0
GAP_DECAY = 0.8  # per request: a sequence's gap between its result and its next request
SHARING_DECAY = 0.9  # per pass: the sessions sharing the device, over the last ~10 passes
CLIENT_FORGET_S = 60.0  # a client in no pass for this long is forgotten


@dataclass(frozen=True)
class Windows:
    """The scheduler's wall-clock windows (the constants above). A time-dilated testbed
    (`cloud serve --emulate-dilate K`, which `bench load --dilate K` passes) stretches them
    with the emulated device's step, so they keep their length in the emulated world."""

    prefill_alone_s: float = PREFILL_ALONE_S
    recent_s: float = RECENT_S
    gather_s: float = GATHER_S
    client_recent_s: float = CLIENT_RECENT_S
    client_forget_s: float = CLIENT_FORGET_S

    def dilated(self, k: float) -> Windows:
        return Windows(*(k * getattr(self, f.name) for f in fields(self)))


@dataclass(eq=False)
class Job:
    """One request in the scheduler: scored in chunks, one per pass, of at most its
    sequence's grant (acespec.cloud.verify.share) and the pass's budgets."""

    req: Request
    fut: asyncio.Future
    grant: Callable[[], int] | None  # nodes per pass; None: all at once
    client: str = ""  # whose: the client's sessions share its part of a pass
    reduce: Callable[[torch.Tensor, int], object] | None = None  # scoring a prompt: each
    # chunk's logits [n, V] and its offset in the request become what is kept of them
    start: int = -1  # the sequence's KV length before the first chunk (-1: none yet)
    done: int = 0  # nodes scored so far
    rows: list = field(default_factory=list)  # logits of the chunks so far
    queued: float = field(default_factory=time.perf_counter)  # when score() got it

    @property
    def key(self) -> KVCache:
        return self.req.cache  # one sequence: its chunks and requests go in order

    @property
    def prefill(self) -> bool:
        """A prompt: chunked by the pass's prefill budget."""
        return self.req.last_only or self.reduce is not None

    @property
    def left(self) -> int:
        return len(self.req.tokens) - self.done


class Batcher:
    """Continuous batching at node granularity. Each pass takes, from every queued
    sequence in arrival order, the next chunk of its oldest request: at most its grant
    (the session's earned share) and, for a prompt (a last_only request), the pass's prefill
    budget, within max_batch_nodes. A long prompt is thus prefilled in chunks between other
    sessions' decode passes (the Sarathi/vLLM technique), and a session that sends more
    than it earns waits for later passes instead of slowing everyone's."""

    def __init__(self, model: Transformer, max_batch_nodes: int = 1024,
                 emulation: StepEmulation = StepEmulation(), on_pass=None):
        self.model, self.max_batch_nodes, self.emulation = model, max_batch_nodes, emulation
        self.windows = Windows().dilated(emulation.dilate)
        self.on_pass = on_pass  # callback(PassStats) for metrics, in the worker thread
        self.cost = PassCost()  # seconds per pass by its nodes, measured here
        self._jobs: list[Job] = []
        self._wake = asyncio.Event()
        self._awaited: set[KVCache] = set()  # the sequences the gather after a pass awaits
        self._back = asyncio.Event()  # ... all of them have queued again (or are forgotten)
        self._arrivals = 0  # requests queued so far (the gather sees whether any still come)
        self._started: asyncio.Future | None = None  # resolved when the next pass starts
        # Per sequence (weakly: a closed session's cache is gone with it): when its last
        # result went out, its typical gap until its next request, when it last decoded.
        self._resolved: WeakKeyDictionary[KVCache, float] = WeakKeyDictionary()
        self._gap: WeakKeyDictionary[KVCache, float] = WeakKeyDictionary()
        self._recent: WeakKeyDictionary[KVCache, float] = WeakKeyDictionary()
        self._owner: WeakKeyDictionary[KVCache, str] = WeakKeyDictionary()  # decoded for whom
        self._clients: dict[str, ClientLoad] = {}  # each client's recent part of the passes
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="target")
        self._task: asyncio.Task | None = None
        self.passes = 0
        self.requests_scored = 0
        self.busy_s = 0.0  # seconds in passes
        self._ended = 0.0  # when the last pass ended (perf_counter)
        self._turned: float | None = None  # ... when the next pass follows on that one, once
        # its sessions have queued again (_gather): the turnaround (PassStats.turnaround)
        self.sharing = 1.0  # sequences per pass, recently: who waits out what else the
        # device runs between passes (a co-located drafter's steps)
        self._refusing: BaseException | None = None  # fail_pending's error, for every request
        self._running: set[Job] = set()  # the jobs of the pass in the worker thread now

    async def score(self, req: Request, grant: Callable[[], int] | None = None,
                    client: str = "", reduce: Callable[[torch.Tensor, int], object] | None
                    = None):
        """Logits for one request ([n, V], or [1, V] with last_only), scored in the next
        passes. grant: how many of its nodes one pass may score (None: all). client: whose
        request (its sessions share the client's part of each pass). reduce: the request is
        a prompt to score, chunked as prefills are, and each chunk's logits are reduced as
        they come (reduce(logits, offset), in the target's worker): returns the list of
        what reduce returned, so a long prompt's logits are never held whole."""
        if self._refusing is not None:
            raise self._refusing
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._worker())
        job = Job(req, loop.create_future(), grant, client, reduce)
        job.fut.add_done_callback(self._on_done)
        self._jobs.append(job)
        if (done := self._resolved.pop(job.key, None)) is not None:
            gap = time.perf_counter() - done
            self._gap[job.key] = GAP_DECAY * self._gap.get(job.key, gap) + (1 - GAP_DECAY) * gap
        self._wake.set()
        self._arrivals += 1
        self._came(job.key)
        return await job.fut

    def _came(self, key: KVCache) -> None:
        """A sequence the gather awaits has queued again or is forgotten."""
        if key in self._awaited:
            self._awaited.discard(key)
            if not self._awaited:
                self._back.set()

    def next_start(self) -> asyncio.Future:
        """A future resolved when the next pass starts: what waits for the device's
        next pass (a session's write of the last one's result) waits on it, so it does not
        run in the verifier's turnaround between passes."""
        if self._started is None or self._started.done():
            self._started = asyncio.get_running_loop().create_future()
        return self._started

    def forget(self, key: KVCache) -> None:
        """A sequence that will not be scored again (its session done or closed): a prompt's
        prefill no longer yields to it, nor a pass waits for it to come back."""
        for times in (self._recent, self._resolved, self._gap, self._owner):
            times.pop(key, None)
        self._came(key)

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            plan = self._plan()
            if not plan:
                self._wake.clear()
                self._turned = None  # idle: the next pass starts on a new request
                continue
            t0 = time.perf_counter()
            clients = _client_nodes(plan)
            self._running = {job for job, _ in plan}
            try:
                await loop.run_in_executor(self._pool, self._run, plan, clients)
            finally:
                self._running = set()
            wait_s = max(self.windows.gather_s, GATHER_SHARE * (time.perf_counter() - t0))
            back = self._settle(plan, wait_s)
            # Drop the requests now, not when the next one arrives: each holds its KV cache,
            # whose blocks go back to the pool (which may then shrink) only once unreferenced.
            plan = None
            await self._gather(back, wait_s)
            # The device idles from here to the next pass while the loop turns the pass's
            # sessions around (their decisions and next requests) and plans that pass.
            self._turned = self._ended if back else None
            back = None  # nor hold the sequences while idle

    async def _gather(self, back: set[KVCache], wait_s: float) -> None:
        """Wait until the sequences in `back` have queued again, while requests keep
        arriving (at least one every GATHER_S), for wait_s at most. A sequence forgotten
        meanwhile (its session done) is not waited for. Woken only by the last of them or
        a quiet GATHER_S, not by each: the turnaround of many sessions is the device's idle
        time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        self._awaited = {k for k in back if k in self._gap} - {j.key for j in self._jobs}
        self._back.clear()
        try:
            while self._awaited:
                left, seen = deadline - loop.time(), self._arrivals
                if left <= 0:
                    return
                try:
                    await asyncio.wait_for(self._back.wait(), min(left, self.windows.gather_s))
                except TimeoutError:
                    if self._arrivals == seen:  # none came for GATHER_S: the rest are not
                        return  # coming soon
        finally:
            self._awaited = set()

    def _plan(self) -> list[tuple[Job, Request]]:
        """The next pass: (job, chunk) per queued sequence, in arrival order."""
        self._drop_cancelled()
        now = time.perf_counter()
        for times in (self._recent, self._resolved):
            for k in [k for k, t in times.items() if now - t >= self.windows.recent_s]:
                del times[k]
        seen: set[KVCache] = set()
        heads = [j for j in self._jobs if not (j.key in seen or seen.add(j.key))]
        room = self.max_batch_nodes
        decode = [j for j in heads if not j.prefill]
        prefill = in_turn([j for j in heads if j.prefill], lambda j: j.client,
                          lambda j: j.left)  # each client's shortest first, short first
        wants = [(job, min(job.left, job.grant() if job.grant else job.left))
                 for job in decode]
        level, plan, used = self._fair_level(wants, now), [], {}
        for job, want in wants:  # in arrival order: a client's held sessions go first next
            mine = used.get(job.client, 0)
            if mine and mine + want > level:  # beyond its first session, whole ones within
                continue  # its part of the pass
            n = min(want, room)
            if n > 0:
                plan.append((job, n))
                room -= n
                used[job.client] = mine + n
        prefill_room = self._prefill_budget(heads, sum(n for _, n in plan)) if prefill else 0
        for job in prefill:
            n = min(job.left, room, prefill_room)
            if n > 0:
                plan.append((job, n))
                room, prefill_room = room - n, prefill_room - n
        return [(job, self._chunk(job, n)) for job, n in plan]

    def _fair_level(self, wants: list[tuple[Job, int]], now: float) -> float:
        """The most decode nodes one client may have in this pass (clients.fair_level): by
        what each client has queued, and for a client busy lately with nothing queued now
        (its sessions' results on their way to it), its recent nodes per pass, so the pass
        it comes back to is not one other client has filled meanwhile."""
        demand: dict[str, float] = {}
        for job, want in wants:
            demand[job.client] = demand.get(job.client, 0) + want
        for client, load in self._clients.items():
            if client not in demand and now - load.last < self.windows.client_recent_s:
                demand[client] = load.nodes
        return fair_level(demand, self.cost.hinge()[2])

    def client_nodes(self, client: str) -> float:
        """A client's nodes per pass, in its recent passes."""
        load = self._clients.get(client)
        return load.nodes if load else 0.0

    def _on_clients(self, parts: dict[str, int], now: float) -> None:
        for client, nodes in parts.items():
            self._clients.setdefault(client, ClientLoad()).on_pass(nodes, now)
        for client in [c for c, load in self._clients.items()
                       if now - load.last > self.windows.client_forget_s]:
            del self._clients[client]

    def _new_prompts(self, heads: list[Job], decoding: set[str]) -> list[int]:
        """Each new client's shortest waiting prompt, in tokens: a session's prompt (not
        one scored for its logprobs) of a client decoding nothing and in no pass within
        CLIENT_RECENT_S, i.e. waiting for its first token."""
        now, shortest = time.perf_counter(), {}
        for j in heads:
            if j.req.last_only and j.reduce is None and j.client not in decoding:
                load = self._clients.get(j.client)
                if load is None or now - load.last >= self.windows.client_recent_s:
                    shortest[j.client] = min(j.left, shortest.get(j.client, j.left))
        return list(shortest.values())

    def _prefill_budget(self, heads: list[Job], decode_nodes: int) -> int:
        """Prompt tokens this pass may carry, by the measured cost of self.cost (a line, or
        flat up to a knee then linear; at least PREFILL_MIN). Beside other sessions (another
        queued now, or one that decoded within RECENT_S), as many as keep the pass within
        1 + PREFILL_SLACK of its cost without them, or more to take new clients' prompts
        whole (_new_prompts): shortest first, as many as keep it within 1 + r of that cost
        (r: new clients per decoding one, so each new client's prompt gets about a
        decoding client's part of the pass) and within PREFILL_ALONE_S. A burst of new
        clients is thus not fed a few prompt tokens a pass, while a prompt too long for
        that goes in chunks within PREFILL_SLACK. Alone, as many as fit in
        PREFILL_ALONE_S, so a session that arrives meanwhile waits no longer than that."""
        keys = {j.key for j in heads}
        decoding = {j.client for j in heads if not j.prefill} | \
            {self._owner.get(k, "") for k in self._recent if k not in keys}
        base, per_node, knee = self.cost.hinge()
        if per_node <= 0:
            return self.max_batch_nodes
        alone_s = self.windows.prefill_alone_s
        if decode_nodes > 0 or decoding or len(keys) > 1:
            d = max(decode_nodes, 1)

            def within(slack: float) -> float:  # cost(d + c) <= (1 + slack) cost(d), with
                # cost(n) = base + per_node (n - knee)+
                return knee + ((1 + slack) * (base + per_node * max(0, d - knee)) - base) \
                    / per_node - d

            new = self._new_prompts(heads, decoding)
            room = min(within(len(new) / max(1, len(decoding))),
                       knee + (alone_s - base) / per_node - d)
            spare = max(within(PREFILL_SLACK), _whole(new, room))
        else:
            spare = knee + (alone_s - base) / per_node
        return min(self.max_batch_nodes, max(PREFILL_MIN, int(spare)))

    @staticmethod
    def _chunk(job: Job, n: int) -> Request:
        r, end = job.req, job.done + n
        if job.start < 0:
            job.start = r.cache.length
        parents = None if r.parents is None else list(r.parents[job.done:end])
        return Request(list(r.tokens[job.done:end]), r.cache, parents, r.last_only)

    def fail_pending(self, error: BaseException) -> None:
        """Fail every queued request with `error` (their sequences' KV as before them), and
        every later one: no pass will run for them (the server is going away). A request in
        the pass running now is failed too, but its KV is the worker's until the pass ends
        (then _settle drops its slots): the pass is planning and writing that cache."""
        self._refusing = error
        for job in list(self._jobs):
            if job not in self._running:
                if job.start >= 0:
                    job.req.cache.truncate(job.start)
                self._jobs.remove(job)
            _resolve(job.fut, error)

    def _on_done(self, fut: asyncio.Future) -> None:
        if fut.cancelled():  # its caller gave up: let the worker drop it (and its KV) now
            self._wake.set()

    def _drop_cancelled(self) -> None:
        """Forget requests whose caller gave up, with any chunks of them already in the KV."""
        for job in [j for j in self._jobs if j.fut.done()]:
            self._drop(job)

    def _drop(self, job: Job) -> None:
        """Forget a request whose future is settled without its result, with its KV."""
        if job in self._jobs:
            self._jobs.remove(job)
        if job.start >= 0:
            job.req.cache.truncate(job.start)

    def _settle(self, plan: list[tuple[Job, Request | BaseException]], wait_s: float
                ) -> set[KVCache]:
        """After a pass: finished (or failed) requests get their logits (or error).
        Returns the sequences expected straight back (their gap is below wait_s)."""
        now, back = time.perf_counter(), set()
        for job, out in plan:
            if not job.prefill:
                self._recent[job.key] = now
                self._owner[job.key] = job.client
            if job.fut.done():  # given up or failed (fail_pending) during the pass
                self._drop(job)
            elif isinstance(out, BaseException):
                if job.start >= 0:
                    job.req.cache.truncate(job.start)  # its earlier chunks too
                self._finish(job, out)
            elif job.left == 0:
                self._finish(job, job.rows if job.reduce is not None else
                             out if len(job.rows) == 1 else torch.cat(job.rows))
                self._resolved[job.key] = now
                if self._gap.get(job.key, math.inf) < wait_s:
                    back.add(job.key)
        return back

    def _finish(self, job: Job, result) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
        self.requests_scored += 1
        _resolve(job.fut, result)

    def _run(self, plan: list, clients: dict[str, int]) -> None:
        """One pass over the planned chunks (in the worker thread). Each plan entry's
        chunk is replaced by its logits or its error. clients: nodes per client in it."""
        chunks = [chunk for _, chunk in plan]
        nodes = sum(len(c.tokens) for c in chunks)
        t0 = time.perf_counter()
        if (started := self._started) is not None:  # resolved from here, once the pass runs:
            # what waits for it (writes) would otherwise hold the GIL this thread needs first
            started.get_loop().call_soon_threadsafe(_resolve, started, None)
        turnaround = 0.0 if self._turned is None else t0 - self._turned
        waits = tuple(t0 - job.queued for job, _ in plan if job.done == 0)
        try:
            results = self.model.forward_batch(chunks)
        except Unavailable as e:  # no pass can run (a lost rank): every request fails alike
            results = [e] * len(chunks)
        except Exception:  # one bad request must not fail the others: retry one by one
            log.exception("batched forward failed; retrying %d requests separately",
                          len(chunks))
            results = []
            for c in chunks:
                try:
                    results.append(self.model.forward_batch([c])[0])
                except Exception as e:  # noqa: BLE001 - delivered to that request only
                    results.append(e)
        # The emulated step is the pass's duration: the real compute (a small target on
        # this machine) runs inside it, as a big model's pass on its device would last the
        # step whatever else the host does; a pass whose real compute is longer keeps it.
        left = self.emulation.seconds(nodes) - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        self._ended = time.perf_counter()
        seconds = self._ended - t0
        self.passes += 1
        self.busy_s += seconds
        self.sharing = SHARING_DECAY * self.sharing + (1 - SHARING_DECAY) * len(chunks)
        self.cost.observe(nodes, seconds)
        prompts = [c for job, c in plan if job.prefill]
        self._on_clients(clients, time.perf_counter())  # the loop plans only between passes
        for i, ((job, chunk), res) in enumerate(zip(plan, results)):
            if not isinstance(res, BaseException):
                if job.reduce is not None:  # kept reduced: the logits go now
                    try:
                        job.rows.extend(job.reduce(res, job.done))
                        res = None
                    except Exception as e:  # noqa: BLE001 - delivered to that request only
                        plan[i] = (job, e)
                        continue
                job.done += len(chunk.tokens)
                if job.reduce is None and (not job.req.last_only or job.left == 0):
                    job.rows.append(res)
            plan[i] = (job, res)
        if self.on_pass:
            self.on_pass(PassStats(len(chunks), nodes, seconds,
                                   prefill=sum(len(c.tokens) for c in prompts),
                                   prefills=len(prompts), waits=waits, clients=clients,
                                   turnaround=turnaround))

    @property
    def waiting(self) -> int:
        """Sequences with a request queued that no pass has started (read by the
        metrics' thread)."""
        return len({j.key for j in list(self._jobs) if j.start < 0})

    @property
    def prefilling(self) -> int:
        """Sequences whose prompt a pass has yet to finish (read by the metrics' thread):
        open, but not decoding yet."""
        return len({j.key for j in list(self._jobs) if j.prefill})

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The target's one worker: what else runs on the device (a co-located drafter)
        queues here between passes."""
        return self._pool

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _whole(sizes: list[int], room: float) -> int:
    """The most tokens of whole prompts, shortest first, that fit in `room`."""
    total = 0
    for n in sorted(sizes):
        if total + n > room:
            break
        total += n
    return total


def _client_nodes(plan: list[tuple[Job, Request]]) -> dict[str, int]:
    """Nodes per client in a planned pass."""
    parts: dict[str, int] = {}
    for job, chunk in plan:
        parts[job.client] = parts.get(job.client, 0) + len(chunk.tokens)
    return parts


def _resolve(fut: asyncio.Future, result) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
