"""Prometheus metrics of the verifier (served as text on --metrics-port).

Besides the verifier's own counts (passes, nodes, proposals, shares), the figures operators
watch on other model servers (vLLM's set is the anchor): time to first token, time per
output token and request latency as histograms, queue wait, sessions waiting for a pass, KV
blocks in use against what the device can hold, and acceptance by draft source. A call's
timeline is a RequestClock; docs/deploy.md gives each metric's PromQL."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily

from acespec.cloud import errors

KINDS = ("decided", "edge_decided", "generate")  # the calls a verifier serves: sessions it
# decides (greedy, coupled), sessions the edge decides (exact sampling), cloud-only Generate
SOURCES = ("edge", "lookup", "gap")  # who drafted a scored token: the edge, the verifier's
# prompt lookup, its gap drafter
FATES = ("scored", "accepted")
ERROR_CODES = tuple(sorted({c.code for c in vars(errors).values()
                            if isinstance(c, type) and issubclass(c, errors.SessionError)}))

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                0.5, 0.75, 1.0, 2.5, 5.0)
LATENCY_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                   60.0, 120.0, 240.0, 480.0, 960.0)
REACH_BUCKETS = (-32, -16, -12, -8, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 6, 8, 16, 32)  # positions
# past the end: each one near it, where a line arrives a round trip behind or just ahead
WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0)


ClientRow = tuple[str, list, float]  # (client, its open sessions' shares, its nodes per pass)


class ClientSeries:
    """The per-client series, read from the engine at each scrape (Engine.client_rows): a
    client's open sessions, the speculative nodes per pass they have earned, and its part of
    the recent passes. Setting them after every pass took the verifier's event loop between
    passes, once per client; a scrape reads them only when asked."""

    def __init__(self, registry: CollectorRegistry):
        self.rows: Callable[[], list[ClientRow]] = list  # none until the engine is watched
        registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        share = GaugeMetricFamily(
            "acespec_client_share", "Speculative nodes per pass a client's open sessions "
            "have earned together (docs/design.md §3), by client; gone when its last session "
            "ends", labels=["client"])
        sessions = GaugeMetricFamily("acespec_client_sessions", "A client's open sessions",
                                     labels=["client"])
        nodes = GaugeMetricFamily("acespec_client_nodes", "Nodes per pass a client's "
                                  "sessions had in its recent passes (its part of a pass)",
                                  labels=["client"])
        for client, shares, part in self.rows():
            share.add_metric([client], sum(s.nodes() for s in shares))
            sessions.add_metric([client], len(shares))
            nodes.add_metric([client], round(part, 2))
        yield from (share, sessions, nodes)


@dataclass
class Metrics:
    registry: object
    sessions_opened: object
    sessions_active: object
    nodes_scored: object
    passes: object
    batch_nodes: object
    batch_sessions: object
    prefill_chunks: object
    message_bytes: object
    errors: object
    allreduce_bytes: object
    proposals: object
    gap_seconds: object
    clients: ClientSeries
    speculative_nodes: object
    busy_seconds: object
    turnaround_seconds: object
    requests: object
    prompt_tokens: object
    generation_tokens: object
    ttft: object
    tpot: object
    latency: object
    queue_wait: object
    sessions_waiting: object
    sessions_prefilling: object
    draft_tokens: object
    grow_reach: object
    kv_blocks_used: object
    kv_blocks_allocated: object
    kv_blocks_capacity: object
    tp_ranks: object
    _counted: dict = field(default_factory=dict)  # session id -> (accepted, wasted) counted
    _children: dict = field(default_factory=dict)  # (metric id, labels) -> its series

    @classmethod
    def create(cls) -> Metrics:
        r = CollectorRegistry(auto_describe=True)  # every series by name (?name[]=)
        ProcessCollector(registry=r)  # process_start_time_seconds: a restart, for the alerts
        m = cls(
            registry=r,
            sessions_opened=Counter("acespec_sessions_opened", "Sessions opened", registry=r),
            sessions_active=Gauge("acespec_sessions_active", "Sessions open now", registry=r),
            nodes_scored=Counter("acespec_nodes_scored", "Tree nodes scored", registry=r),
            passes=Counter("acespec_passes", "Passes of the target (one forward over every "
                           "session it scores)", registry=r),
            batch_nodes=Histogram("acespec_batch_nodes", "Nodes per pass", registry=r,
                                  buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)),
            batch_sessions=Histogram("acespec_batch_sessions", "Requests per pass",
                                     registry=r, buckets=(1, 2, 4, 8, 16, 32, 64)),
            prefill_chunks=Counter("acespec_prefill_chunks", "Of the passes' requests, "
                                   "chunks of prompts (the rest decode)", registry=r),
            message_bytes=Counter("acespec_message_bytes", "Serialized protobuf bytes",
                                  ["direction"], registry=r),
            errors=Counter("acespec_errors", "Sessions ended by an error", ["code"], registry=r),
            allreduce_bytes=Gauge("acespec_tp_allreduce_bytes", "Bytes rank 0 all-reduced "
                                  "with the other tensor-parallel ranks since start (0 on "
                                  "one device)", registry=r),
            proposals=Counter("acespec_proposals", "The verifier's own proposals in passes "
                              "no edge draft covered, by source (lookup, gap) and fate "
                              "(scored, accepted)", ["source", "fate"], registry=r),
            gap_seconds=Counter("acespec_gap_seconds", "Seconds the gap drafter spent "
                                "decoding proposals", registry=r),
            clients=ClientSeries(r),
            speculative_nodes=Counter("acespec_speculative_nodes", "Speculative nodes "
                                      "scored, by fate: accepted, or wasted (never taken)",
                                      ["fate"], registry=r),
            busy_seconds=Counter("acespec_busy_seconds", "Seconds the target's device was "
                                 "busy, by work: pass (the target's passes) or draft (the "
                                 "gap drafter's batched steps)", ["work"], registry=r),
            turnaround_seconds=Counter("acespec_turnaround_seconds", "Seconds the device "
                                       "waited between passes while the sessions of a pass "
                                       "queued again and the next pass was planned (the "
                                       "verifier's turnaround: their decisions and next "
                                       "requests)", registry=r),
            requests=Counter("acespec_requests", "Calls started, by kind (decided, "
                             "edge_decided, generate)", ["kind"], registry=r),
            prompt_tokens=Counter("acespec_prompt_tokens", "Prompt tokens of the calls "
                                  "started", ["kind"], registry=r),
            generation_tokens=Counter("acespec_generation_tokens", "Output tokens of the "
                                      "calls finished (an edge-decided session's: its "
                                      "committed tokens)", ["kind"], registry=r),
            ttft=Histogram("acespec_time_to_first_token_seconds", "From a call's request to "
                           "its first token on the wire (an edge-decided session: the root's "
                           "distribution)", ["kind"], buckets=TTFT_BUCKETS, registry=r),
            tpot=Histogram("acespec_time_per_output_token_seconds", "A finished call's time "
                           "after its first token per further output token", ["kind"],
                           buckets=TPOT_BUCKETS, registry=r),
            latency=Histogram("acespec_request_latency_seconds", "A finished call's time from "
                              "its request to its last token", ["kind"],
                              buckets=LATENCY_BUCKETS, registry=r),
            queue_wait=Histogram("acespec_queue_wait_seconds", "How long a request to the "
                                 "target waited before the pass that starts scoring it",
                                 buckets=WAIT_BUCKETS, registry=r),
            sessions_waiting=Gauge("acespec_sessions_waiting", "Sequences with a request "
                                   "queued that no pass has started", registry=r),
            sessions_prefilling=Gauge("acespec_sessions_prefilling", "Sequences whose "
                                      "prompt a pass has yet to finish (open, not decoding "
                                      "yet)", registry=r),
            grow_reach=Histogram("acespec_edge_grow_reach", "How many positions past the "
                                 "decided end an edge's Grow message reaches when the "
                                 "verifier applies it (<= 0: every position it drafts was "
                                 "decided before it arrived)", registry=r,
                                 buckets=REACH_BUCKETS),
            draft_tokens=Counter("acespec_draft_tokens", "Speculated tokens scored and "
                                 "accepted, by source: edge (the edge's drafts; in "
                                 "edge-decided sessions, nodes scored and committed), "
                                 "lookup and gap (the verifier's own proposals)",
                                 ["source", "fate"], registry=r),
            kv_blocks_used=Gauge("acespec_kv_blocks_used", "KV-cache blocks holding "
                                 "sequences", registry=r),
            kv_blocks_allocated=Gauge("acespec_kv_blocks_allocated", "KV-cache blocks the "
                                      "paged pool holds now (it grows by doubling)",
                                      registry=r),
            kv_blocks_capacity=Gauge("acespec_kv_blocks_capacity", "The most KV-cache "
                                     "blocks the pool can hold: its own and what the "
                                     "device's free memory fits", registry=r),
            tp_ranks=Gauge("acespec_tp_ranks", "Ranks in the tensor-parallel group (1: one "
                           "device)", registry=r),
        )
        m._initialize()
        return m

    def _initialize(self) -> None:
        """Every labelled series at 0, so rates and ratios have data before the first
        event (an error code never seen is a rate of 0, not a missing series)."""
        for code in ERROR_CODES:
            self.errors.labels(code)
        for kind in KINDS:
            for metric in (self.requests, self.prompt_tokens, self.generation_tokens,
                           self.ttft, self.tpot, self.latency):
                metric.labels(kind)
        for fate in FATES:
            for source in SOURCES:
                self.draft_tokens.labels(source, fate)
            for source in SOURCES[1:]:
                self.proposals.labels(source, fate)
        for direction in ("up", "down"):
            self.message_bytes.labels(direction)
        for work in ("pass", "draft"):
            self.busy_seconds.labels(work)
        for fate in ("accepted", "wasted"):
            self.speculative_nodes.labels(fate)
        self.tp_ranks.set(1)

    def watch(self, engine) -> None:
        """Read the engine's queue and KV pool at each scrape
        (acespec.cloud.verify.engine.Engine)."""
        model, batcher = engine.model, engine.batcher
        self.clients.rows = engine.client_rows
        self.sessions_waiting.set_function(lambda: batcher.waiting)
        self.sessions_prefilling.set_function(lambda: batcher.prefilling)
        pool = model.pool  # made now, on the serving thread, not by a scrape
        self.kv_blocks_allocated.set_function(lambda: pool.n_blocks)
        self.kv_blocks_used.set_function(lambda: pool.n_blocks - len(pool.free_blocks))
        self.kv_blocks_capacity.set_function(lambda: pool.n_blocks + _free_bytes(pool.k[0])
                                             // _block_bytes(pool))

    def _of(self, metric, *labels: str):
        """A series of a labelled metric whose series are never removed, kept: labels()
        hashes and locks on each call, and the hot path counts several per session a pass."""
        key = (id(metric), labels)
        if (child := self._children.get(key)) is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def on_message(self, direction: str, nbytes: int) -> None:
        """A message's serialized bytes, "up" or "down"."""
        self._of(self.message_bytes, direction).inc(nbytes)

    def on_draft(self, seconds: float) -> None:
        self._of(self.busy_seconds, "draft").inc(seconds)

    def on_share(self, session_id: str, share) -> None:
        """A session's share after its pass (acespec.cloud.verify.share.Share)."""
        accepted, wasted = share.total_accepted, share.wasted
        seen_a, seen_w = self._counted.get(session_id, (0, 0))
        self._of(self.speculative_nodes, "accepted").inc(max(0, accepted - seen_a))
        self._of(self.speculative_nodes, "wasted").inc(max(0, wasted - seen_w))
        self._counted[session_id] = (accepted, wasted)

    def drop_share(self, session_id: str) -> None:
        self._counted.pop(session_id, None)

    def on_proposals(self, source: str, scored: int, accepted: int, gap_s: float) -> None:
        """One pass's own proposals (acespec.cloud.verify.decided): what was scored and taken."""
        if scored:
            self._of(self.proposals, source, "scored").inc(scored)
            self._of(self.proposals, source, "accepted").inc(accepted)
            self._of(self.draft_tokens, source, "scored").inc(scored)
            self._of(self.draft_tokens, source, "accepted").inc(accepted)
        if gap_s:
            self.gap_seconds.inc(gap_s)

    def on_grow(self, reach: int) -> None:
        """An edge's Grow applied: how far past the decided end it reached."""
        self.grow_reach.observe(reach)

    def on_edge_drafts(self, scored: int, accepted: int) -> None:
        """The edge's drafts a pass scored, and those a walk or a commit took."""
        self._of(self.draft_tokens, "edge", "scored").inc(max(0, scored))
        self._of(self.draft_tokens, "edge", "accepted").inc(max(0, accepted))

    def on_pass(self, stats) -> None:
        self.passes.inc()
        self._of(self.busy_seconds, "pass").inc(stats.seconds)
        self.nodes_scored.inc(stats.nodes)
        self.batch_nodes.observe(stats.nodes)
        self.batch_sessions.observe(stats.sessions)
        self.prefill_chunks.inc(stats.prefills)
        self.turnaround_seconds.inc(stats.turnaround)
        for wait in stats.waits:
            self.queue_wait.observe(wait)

    def serve(self, port: int, host: str = "0.0.0.0"):
        """Start the HTTP exporter in a thread; returns (server, bound port)."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        return server, server.server_port


class RequestClock:
    """One call's timeline, for the latency histograms: started at its request; its first
    token; its end. Counts nothing when the verifier keeps no metrics (None)."""

    def __init__(self, metrics: Metrics | None, kind: str, prompt_tokens: int = 0):
        self.metrics, self.kind = metrics, kind
        self.start = time.perf_counter()
        self.first: float | None = None
        self.finished = False
        if metrics:
            metrics.requests.labels(kind).inc()
            metrics.prompt_tokens.labels(kind).inc(prompt_tokens)

    def first_token(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()
            if self.metrics:
                self.metrics.ttft.labels(self.kind).observe(self.first - self.start)

    def finish(self, tokens: int) -> None:
        """The call ended as asked, with `tokens` output tokens; counted once."""
        if not self.metrics or self.finished:
            return
        self.finished = True
        now = time.perf_counter()
        self.metrics.latency.labels(self.kind).observe(now - self.start)
        self.metrics.generation_tokens.labels(self.kind).inc(tokens)
        if self.first is not None and tokens > 1:
            self.metrics.tpot.labels(self.kind).observe((now - self.first) / (tokens - 1))


def _block_bytes(pool) -> int:
    """Bytes one block takes in every layer's k and v (acespec.cloud.target.kv_cache.PagePool)."""
    return sum(t[0].numel() * t.element_size() for t in (*pool.k, *pool.v))


def _free_bytes(tensor: torch.Tensor) -> int:
    """Memory free for the pool to grow into, on the device that holds `tensor`: a CUDA
    device's free memory; on the CPU the host's available memory, within a cgroup's limit."""
    if tensor.device.type == "cuda":
        return torch.cuda.mem_get_info(tensor.device)[0]
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    limit = Path("/sys/fs/cgroup/memory.max")  # cgroup v2: a container's memory limit
    try:
        most = limit.read_text().strip()
        if most.isdigit():
            used = int((limit.parent / "memory.current").read_text())
            free = min(free, max(0, int(most) - used))
    except OSError:
        pass
    return free
