"""Many users on one verifier: `acespec bench load`.

One verifier (its own process, a step profile), and N clients at once, closed loop: each
runs `requests` generations back to back, each on a real prompt, through a link of its own
(the link proxy shapes every connection apart). The clients run as tasks in as few edge
processes as the machine needs (`per_process` each, one llama.cpp drafter per process with a
sequence set per client); their drafting is not charged to the verifier, which is what an
edge on the user's own device costs the server, and they run at a lower CPU priority
(`edge_nice`), so that on a shared machine they take the CPU the verifier leaves rather than
slowing it, as edges on their users' own devices would not. For each mode and N the bench
reports what the users saw (per-client tokens/s p50 and p10, TTFT p50 and p90), what the server did
(aggregate tokens/s, busy fraction, busy seconds and scored nodes per token, passes a second
and the requests a pass held, the share of tokens decided in passes that held an edge draft),
and at the end the goodput: the most clients whose p10 client still meets the SLO.

Modes are the bench's: `ar` (cloud only), `acespec`, `acespec-gap` (acespec with the
verifier's gap drafter: hybrid drafting, the verifier's own drafts where the edge's do not
reach while the device has room for them), and the rivals that speculate at the verifier
(`colo`, `cloud-lookup`; docs/design.md §3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import grpc
import numpy as np

from acespec.edge.client import CHANNEL_OPTIONS
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
from acespec.edge.session import EdgeEngine, EngineConfig
from acespec.edge.session.config import GROW_SEQS
from acespec.edge.session.offline import STALL_S
from acespec.edge.text import TextCodec
from acespec.procs import python_module
from acespec.shared import modes
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams
from acespec.sim.bench import BenchConfig, _verifier_process, parse_links
from acespec.sim.des import ModelCosts
from acespec.sim.des_many import MANY_MODES, Fleet, simulate_many
from acespec.sim.proxy import ProxyThread
from acespec.sim.stages import LinkSpec

GPU_LIKE = "25,0.1,256"  # flat 25 ms up to 256 nodes a pass, then 0.1 ms per node
# The edges' drafter step: a 1B-class drafter on a laptop (about 12 ms a decode on an
# Apple-silicon GPU or a recent x86 laptop's cores, 1 ms more per extra sequence in a batch).
# The tiny demo drafter's real decode on two shared cores stays below it, so every edge runs
# at the laptop's pace, not at what the testbed's CPU has left.
EDGE_DRAFT_MS = (12.0, 1.0)
CPU_BOUND = 0.8  # a row whose machine was busier than this measured the CPU, not the device
SLO_SPEEDUP = 1.3  # per-client tokens/s >= this x ar's one-client rate, measured in the run
SLO_TTFT_S = 2.0  # ... and TTFT p90 at most this


@dataclass(frozen=True)
class LoadConfig:
    clients: tuple[int, ...] = (1, 2, 4, 8, 16)
    modes: tuple[str, ...] = modes.LOAD_DEFAULT
    link: str = "50kbit:50ms"
    emulate: str = GPU_LIKE  # the verifier's --emulate-step-ms
    cloud_draft: str = "5,0.05"  # the verifier's --emulate-cloud-draft-ms (colo)
    propose: int = 8
    requests: int = 2  # generations per client at each point, back to back
    max_tokens: int = 64
    temperature: float = 0.0
    per_process: int = 16  # clients per edge process
    edge_nice: int = 19  # the edge processes' niceness: they take the CPU the verifier leaves
    slo_speedup: float = SLO_SPEEDUP
    slo_ttft_s: float = SLO_TTFT_S
    slo_tok_s: float | None = None  # per-client tokens/s; None: slo_speedup x ar's 1-client
    emulate_draft: tuple[float, float] = EDGE_DRAFT_MS  # the edges' --emulate-draft-ms
    dilate: float = 1.0  # time dilation: every time constant of the emulated world x this

    def __post_init__(self):
        modes.check(self.modes, modes.LOAD, "bench load")
        if not self.clients or any(n < 1 for n in self.clients):
            raise ValueError(f"--clients wants counts >= 1, got {self.clients}")
        if self.slo_tok_s is None and not ("ar" in self.modes and 1 in self.clients):
            raise ValueError("the default SLO is relative to ar with 1 client: include ar and "
                             "1 in --modes/--clients, or give --slo-tok-s")
        if not 1 <= self.per_process <= 32:
            raise ValueError(f"--per-process must be in [1, 32], got {self.per_process}")
        if not 0 <= self.edge_nice <= 19:
            raise ValueError(f"--edge-nice must be in [0, 19], got {self.edge_nice}")
        if not 1 <= self.dilate <= 100:
            raise ValueError(f"--dilate must be in [1, 100], got {self.dilate:g}")

    def dilated(self) -> Dilated:
        """The emulated world's time constants as the run applies them (x dilate)."""
        step, draft = _profiles(self)
        k = self.dilate
        (_, spec), = parse_links(self.link)
        return Dilated(
            emulate=f"{step.base_ms * k:g},{step.per_node_ms * k:g},{step.knee}",
            cloud_draft=f"{draft.base_ms * k:g},{draft.per_seq_ms * k:g}",
            emulate_draft=(self.emulate_draft[0] * k, self.emulate_draft[1] * k),
            link=replace(spec, up_bps=spec.up_bps / k, down_bps=spec.down_bps / k,
                         rtt_s=spec.rtt_s * k, jitter_s=spec.jitter_s * k),
            stall_s=STALL_S[EngineConfig.offline] * k, backoff_s=EngineConfig.backoff_s * k)

    def verifier(self, drafter: str) -> BenchConfig:
        """The run's verifier (BenchConfig.serve_flags), in the dilated world."""
        world = self.dilated()
        return BenchConfig(links=(), modes=self.modes, max_tokens=self.max_tokens,
                           emulate=world.emulate, propose=self.propose, gap_drafter=drafter,
                           cloud_draft=world.cloud_draft, temperature=self.temperature,
                           dilate=self.dilate)


@dataclass(frozen=True)
class Dilated:
    """Time dilation (as in time-warped network emulation): the verifier's step profile (its
    knee is a node count and stays), the co-located drafter's step, the edges' drafter step,
    the link's delay, the edges' stall threshold and reconnect delay and the verifier's
    scheduling windows (BenchConfig.dilate: its --emulate-dilate), each x K, and the link's
    rate / K. The machine's own compute is not dilated, so it shrinks against the
    emulated device; figures are reported back in the undilated world's units (undilate)."""

    emulate: str  # the verifier's --emulate-step-ms
    cloud_draft: str  # its --emulate-cloud-draft-ms
    emulate_draft: tuple[float, float]  # the edges' drafter step, ms
    link: LinkSpec
    stall_s: float  # an edge's session silent this long while owing an answer is re-dialled
    backoff_s: float  # an edge's first reconnect delay


RATE_KEYS = ("per_client_tok_s_p50", "per_client_tok_s_p10", "aggregate_tok_s",
             "all_live_tok_s", "passes_per_s", "edge_draft_tok_s")  # x K: undilated
TIMELINE_S = 0.1  # a row's timeline bins, seconds (x K in a dilated run: 0.1 s undilated)
TIME_KEYS = ("ttft_p50_s", "ttft_p90_s", "verifier_s_per_1k_tokens", "all_live_s",
             "turnaround_ms")  # / K


def undilate(row: dict, k: float) -> dict:
    """A dilated run's row in the undilated world's units."""
    if k == 1:
        return row
    out = dict(row)
    for key, f in [(key, k) for key in RATE_KEYS] + [(key, 1 / k) for key in TIME_KEYS]:
        if out.get(key) is not None:
            out[key] = round(out[key] * f, 3)
    if (line := out.get("timeline")) is not None:
        out["timeline"] = {**line, "bin_s": round(line["bin_s"] / k, 6),
                           "tok_s": [round(x * k, 1) for x in line["tok_s"]]}
    return out


class CpuMeter:
    """The machine's busy fraction between two readings of /proc/stat, over all cores (None
    where there is no /proc/stat)."""

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    def busy(self) -> float | None:
        end = self._read()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return None
        total, idle = end[0] - self.start[0], end[1] - self.start[1]
        return round(1 - idle / total, 3)


# -- what the users saw: statistics and goodput --------------------------------------------

def point(mode: str, clients: int, records: list[dict], wall_s: float, busy_s: float,
          nodes: float, passes: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0),
          live_sessions: tuple[float, float] | None = None, cpu_busy: float | None = None,
          reach: dict[float, float] | None = None,
          busy_at: list[tuple[float, float]] | None = None, bin_s: float = TIMELINE_S
          ) -> dict:
    """One (mode, N) row from its per-request records {client, tokens, seconds, ttft_s,
    lone_tokens (decided with no edge draft: the first token and the lone passes')}.
    passes: the verifier's passes in the run, the requests they held and of those the
    chunks of prompts (summed): decode_requests_per_pass counts the rest; and the seconds
    the device waited between passes while their sessions queued again and the next pass
    was planned: turnaround_ms a pass on average, turnaround_share of the wall time.
    edge_pass_tokens: the share of tokens decided in passes that held an edge draft (None
    where the verifier decides no session: ar); edge_drafts_scored: the share of the edges'
    drafts that reached a pass before their positions were decided (from the records'
    drafts_received and drafts_scored; None where the edges sent none), and
    edge_draft_tok_s the drafts an edge sent a second of its generation, on average (against
    its drafter's steps a second: how fast the edges draft at this load). live_sessions: the
    sessions open at the verifier and those of them whose prompt was not yet prefilled, on
    average over the point (SessionSampler): the row's live_sessions and decoding_sessions
    (open, less prefilling); cpu_busy: the machine's busy fraction over it (a
    row above CPU_BOUND is cpu_bound: it measured the testbed's CPU, not the device).
    reach: the edges' Grow messages the verifier applied during the point by reach,
    cumulative ({le: count}, Meter.reach): edge_grows_ahead is the share that reached past
    its decided end, edge_grow_reach_p50 the median reach (the bound of its bucket, at most
    the last; negative: that many positions behind the end); None where the edges sent
    none.
    all_live_tok_s: the aggregate while every client was in its run, all_live_s seconds
    (all_live), and all_live_busy the verifier's busy fraction then, from busy_at: samples of
    (wall clock, the verifier's busy seconds so far) around the point (busy_between).
    timeline: the burst's shape, tokens/s and clients in their run per bin_s (timeline)."""
    per_client = {}
    for r in records:
        tok, sec = per_client.get(r["client"], (0, 0.0))
        per_client[r["client"]] = (tok + r["tokens"], sec + r["seconds"])
    rates = [tok / sec for tok, sec in per_client.values() if sec > 0]
    ttft = [r["ttft_s"] for r in records if r.get("ttft_s") is not None]
    tokens = sum(r["tokens"] for r in records)
    lone = [r.get("lone_tokens") for r in records]
    edge = None if not records or None in lone else round(1 - sum(lone) / max(1, tokens), 2)
    sent = sum(r.get("drafts_received") or 0 for r in records)
    scored = round(sum(r.get("drafts_scored") or 0 for r in records) / sent, 3) if sent else None
    drafting_s = sum(r["seconds"] for r in records if r.get("drafts_received") is not None)
    span = live_span(records)
    live_rate, live_s = all_live(records, span)
    live_busy = busy_between(busy_at or [], *span) if span else None
    return {"mode": mode, "clients": clients,
            "per_client_tok_s_p50": _pct(rates, 50), "per_client_tok_s_p10": _pct(rates, 10),
            "ttft_p50_s": _pct(ttft, 50, 3), "ttft_p90_s": _pct(ttft, 90, 3),
            "aggregate_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
            "all_live_tok_s": live_rate, "all_live_s": live_s,
            "verifier_busy": round(min(1.0, busy_s / wall_s), 3) if wall_s > 0 else None,
            "all_live_busy": live_busy,
            "verifier_s_per_1k_tokens": round(1000 * busy_s / max(1, tokens), 2),
            "nodes_per_token": round(nodes / max(1, tokens), 2),
            "passes_per_s": round(passes[0] / wall_s, 2) if wall_s > 0 else None,
            "requests_per_pass": round(passes[1] / passes[0], 2) if passes[0] else None,
            "live_sessions": None if live_sessions is None else round(live_sessions[0], 2),
            "decode_requests_per_pass": round((passes[1] - passes[2]) / passes[0], 2)
            if passes[0] else None,
            "decoding_sessions": None if live_sessions is None
            else round(live_sessions[0] - live_sessions[1], 2),
            "turnaround_ms": round(1000 * passes[3] / passes[0], 2) if passes[0] else None,
            "turnaround_share": round(passes[3] / wall_s, 3) if wall_s > 0 else None,
            "edge_pass_tokens": edge, "edge_drafts_scored": scored,
            "edge_draft_tok_s": round(sent / drafting_s, 1) if sent and drafting_s > 0
            else None,
            **_reach(reach or {}),
            "cpu_busy": cpu_busy,
            "cpu_bound": cpu_busy is not None and cpu_busy > CPU_BOUND,
            "reconnects": sum(r.get("reconnects", 0) for r in records),
            "tokens": tokens, "requests": len(records),
            "timeline": timeline(records, bin_s)}


def timeline(records: list[dict], bin_s: float = TIMELINE_S) -> dict | None:
    """The point's shape over time, from the records' token_times: {bin_s, tok_s: the tokens
    that reached the clients in each bin_s from the burst's start (the earliest generation's
    start) over bin_s, live: the clients in their run during each bin (client_spans)}. Where
    the aggregate is lost: a burst's start (the prompts crossing their links) and tail (its
    slowest clients, alone in their passes). None where the records carry no times."""
    spans = client_spans(records)
    if not spans:
        return None
    start = min(r["end"] - r["seconds"] for r in records)
    times = np.array([t for r in records for t in r.get("token_times") or ()])
    counts = np.bincount(((times - start) // bin_s).astype(int).clip(0))
    edges = start + bin_s * np.arange(len(counts))
    live = [sum(a < e + bin_s and b >= e for a, b in spans.values()) for e in edges.tolist()]
    return {"bin_s": bin_s, "tok_s": [round(float(c) / bin_s, 1) for c in counts],
            "live": live}


def all_live(records: list[dict], span: tuple[float, float] | None = None
             ) -> tuple[float | None, float | None]:
    """(tokens per second, seconds) over the span in which every client was in its run
    (live_span, unless the caller has it), counting the tokens that arrived within it,
    from each record's `token_times` (the wall clock at each token). The aggregate without
    a run's start (its prompts crossing their links) and its tail (the clients that finished
    early no longer there to fill a pass). (None, None) where there is no such span."""
    span = span or live_span(records)
    if span is None:
        return None, None
    start, end = span
    times = [t for r in records for t in r.get("token_times") or ()]
    return round(sum(start < t <= end for t in times) / (end - start), 2), round(end - start, 3)


def live_span(records: list[dict]) -> tuple[float, float] | None:
    """(start, end), wall clock: from the latest of the clients' first tokens to the
    earliest of their last ones (client_spans). None where the records carry no times, or
    the clients' spans share no time."""
    spans = client_spans(records)
    if not spans:
        return None
    start, end = max(a for a, _ in spans.values()), min(b for _, b in spans.values())
    return (start, end) if end > start else None


def client_spans(records: list[dict]) -> dict[int, tuple[float, float]] | None:
    """{client: (its first token, its last one)}, wall clock, over all of a client's
    generations; None where a generation has tokens but not their times (no span to read)."""
    spans: dict[int, tuple[float, float]] = {}
    for r in records:
        t = r.get("token_times")
        if not t:
            if r.get("tokens"):
                return None
            continue
        first, last = spans.get(r["client"], (math.inf, -math.inf))
        spans[r["client"]] = (min(first, t[0]), max(last, t[-1]))
    return spans


def busy_between(samples: list[tuple[float, float]], start: float, end: float
                 ) -> float | None:
    """The verifier's busy fraction from start to end (wall clock), from samples of (wall
    clock, its busy seconds so far), each end read off the line between the samples around
    it. None unless the samples surround the span."""
    if len(samples) < 2 or not samples[0][0] <= start < end <= samples[-1][0]:
        return None
    times, busy = zip(*samples)
    at_start, at_end = np.interp([start, end], times, busy)
    return round(min(1.0, max(0.0, (at_end - at_start) / (end - start))), 3)


def _pct(values: list[float], q: float, digits: int = 2) -> float | None:
    return round(float(np.percentile(values, q)), digits) if values else None


def slo_rate(runs: list[dict], cfg: LoadConfig) -> float:
    """The per-client tokens/s the SLO asks: --slo-tok-s, or slo_speedup x ar's p50 with one
    client in the same run."""
    if cfg.slo_tok_s is not None:
        return cfg.slo_tok_s
    ar = next(r for r in runs if r["mode"] == "ar" and r["clients"] == 1)
    return cfg.slo_speedup * ar["per_client_tok_s_p50"]


def goodput(runs: list[dict], rate: float, ttft_s: float) -> dict[str, int]:
    """Per mode, the most clients whose p10 client makes `rate` tokens/s with TTFT p90 at
    most `ttft_s` (0: none does). A CPU-bound row does not count."""
    out: dict[str, int] = {}
    for r in runs:
        ok = not r.get("cpu_bound") and (r["per_client_tok_s_p10"] or 0) >= rate and \
            r["ttft_p90_s"] is not None and r["ttft_p90_s"] <= ttft_s
        out[r["mode"]] = max(out.get(r["mode"], 0), r["clients"] if ok else 0)
    return out


def _profiles(cfg: LoadConfig):
    """(the target's step, the gap drafter's step) the run emulates."""
    # lazy: the verifier's modules import torch (the cloud extra's)
    from acespec.cloud.verify.batcher import StepEmulation
    from acespec.cloud.verify.gap import DraftEmulation

    return StepEmulation.parse(cfg.emulate), DraftEmulation.parse(cfg.cloud_draft)


def capacity_bound(cfg: LoadConfig) -> float:
    """How many more clients a verifier holds at the same per-client rate when the drafting
    is off its device ("Speculation at a Distance", 2026): 1 + gamma t_d / t_v, with gamma
    the proposals' depth (--propose), t_d the emulated draft step and t_v the emulated
    target pass (their base times, milliseconds)."""
    step, draft = _profiles(cfg)
    return round(1 + cfg.propose * draft.base_ms / step.base_ms, 2) if step.base_ms > 0 \
        else math.inf


def predict(cfg: LoadConfig, runs: list[dict], accept: float, lookup_accept: float
            ) -> list[dict]:
    """The discrete-event model's rows (acespec.sim.des_many) for each measured (mode, N)
    it models, on the run's link and profiles; each run gets predicted_* keys beside, and
    each model row its aggregate against the measured one (`vs_aggregate`) and against the
    measured aggregate while every client is live (`vs_all_live`: like the model, without a
    burst's start and tail)."""

    step, draft = _profiles(cfg)
    costs = ModelCosts(draft_s=cfg.emulate_draft[0] / 1000, target_base_s=step.base_ms / 1000,
                       target_per_node_s=step.per_node_ms / 1000, target_knee=step.knee)
    fleet = Fleet(accept=accept, lookup_accept=lookup_accept, tokens=cfg.max_tokens,
                  draft_base_s=draft.base_ms / 1000, draft_per_seq_s=draft.per_seq_ms / 1000)
    (_, link), = parse_links(cfg.link)
    rows = []
    for r in runs:
        if r["mode"] in MANY_MODES:
            rows.append(simulate_many(r["mode"], r["clients"], link, fleet, costs))
            predicted = rows[-1]["aggregate_tok_s"]
            rows[-1]["vs_aggregate"] = _ratio(predicted, r.get("aggregate_tok_s"))
            rows[-1]["vs_all_live"] = _ratio(predicted, r.get("all_live_tok_s"))
            r.update({f"predicted_{k}": v for k, v in rows[-1].items()
                      if k not in ("mode", "clients")})
    return rows


KEYS = ("mode", "clients", "per_client_tok_s_p50", "per_client_tok_s_p10", "ttft_p50_s",
        "ttft_p90_s", "aggregate_tok_s", "all_live_tok_s", "all_live_s", "verifier_busy",
        "all_live_busy", "turnaround_share", "verifier_s_per_1k_tokens", "nodes_per_token",
        "passes_per_s", "turnaround_ms", "requests_per_pass", "live_sessions",
        "decode_requests_per_pass", "decoding_sessions",
        "edge_pass_tokens", "edge_drafts_scored", "edge_draft_tok_s", "edge_grows_ahead",
        "edge_grow_reach_p50", "reconnects", "cpu_busy")
PREDICTED_KEYS = ("mode", "clients", "per_client_tok_s_p50", "per_client_tok_s_p10",
                  "aggregate_tok_s", "vs_aggregate", "vs_all_live", "verifier_busy",
                  "nodes_per_token")


def _ratio(predicted: float, measured: float | None) -> float | None:
    """predicted / measured, None where nothing was measured."""
    return round(predicted / measured, 2) if measured else None


def markdown(runs: list[dict], keys: tuple[str, ...] = KEYS) -> str:
    """A table of the rows; a CPU-bound row's mode is marked (CPU-bound), and its cpu_busy."""
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in runs:
        cells = [str(r.get(k)) for k in keys]
        if r.get("cpu_bound"):
            cells = [f"{c} (CPU-bound)" if k in ("mode", "cpu_busy") else c
                     for k, c in zip(keys, cells)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_frontier(runs: list[dict], folder: str) -> str:
    """The frontier: aggregate tokens/s against per-client p10 tokens/s, one line per mode
    (each point a client count). Returns the PNG's path."""
    plt, out = _pyplot(folder)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in dict.fromkeys(r["mode"] for r in runs):
        rs = sorted((r for r in runs if r["mode"] == mode), key=lambda r: r["clients"])
        ax.plot([r["per_client_tok_s_p10"] for r in rs], [r["aggregate_tok_s"] for r in rs],
                "o-", label=mode)
        for r in rs:
            ax.annotate(str(r["clients"]), (r["per_client_tok_s_p10"], r["aggregate_tok_s"]),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("per-client tokens/s (p10)")
    ax.set_ylabel("aggregate tokens/s")
    ax.legend()
    return _save(plt, fig, out / "frontier.png")


def plot_timeline(runs: list[dict], folder: str) -> str:
    """The burst's shape: aggregate tokens/s over time, one panel per client count, one
    line per mode (the rows' timeline). Returns the PNG's path."""
    plt, out = _pyplot(folder)
    counts = sorted({r["clients"] for r in runs if r.get("timeline")})
    fig, axes = plt.subplots(len(counts) or 1, 1, figsize=(7, 2.2 * max(1, len(counts))),
                             squeeze=False)
    for ax, n in zip(axes[:, 0], counts):
        for r in (r for r in runs if r["clients"] == n and r.get("timeline")):
            line = r["timeline"]
            ax.step([line["bin_s"] * i for i in range(len(line["tok_s"]))], line["tok_s"],
                    where="post", label=r["mode"])
        ax.set_title(f"{n} clients", fontsize=9)
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("seconds from the burst's start")
    return _save(plt, fig, out / "timeline.png")


def _pyplot(folder: str):
    """(matplotlib's pyplot, the folder made)."""
    import matplotlib  # lazy: the sim extra's, for the plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as matplotlib, once its backend is set

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return plt, out


def _save(plt, fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


# -- the runner ----------------------------------------------------------------------------

def run_load(cfg: LoadConfig, model_dir: str, drafter: str, prompts: list[str],
             progress=print) -> dict:
    """Every mode at every client count on one verifier: {"runs", "goodput", "slo"}."""

    world = cfg.dilated()
    bcfg = cfg.verifier(drafter)

    async def main() -> list[dict]:
        runs = []
        async with _verifier_process(bcfg, model_dir) as start:
            async with start(None) as (host, port, _, meter):
                # Unmeasured: a verifier fresh from its start has measured no pass, and
                # until it has, it takes any prompt whole; the first point measured on it
                # would thus admit its burst of prompts as no later point does.
                progress("warming the verifier up (not measured) ...")
                await asyncio.to_thread(run_point, cfg, cfg.modes[0], min(cfg.clients), host,
                                        port, meter, world, drafter, prompts)
                for mode in cfg.modes:
                    for n in cfg.clients:
                        progress(f"{mode}, {n} clients ...")
                        runs.append(await asyncio.to_thread(
                            run_point, cfg, mode, n, host, port, meter, world, drafter,
                            prompts))
                        r = runs[-1]
                        progress(_progress(r))
        return runs

    runs = asyncio.run(main())
    rate = slo_rate(runs, cfg)
    return {"runs": runs, "goodput": goodput(runs, rate, cfg.slo_ttft_s),
            "slo": {"per_client_tok_s": round(rate, 2), "ttft_p90_s": cfg.slo_ttft_s},
            "capacity_bound": capacity_bound(cfg)}


def run_point(cfg: LoadConfig, mode: str, n: int, host: str, port: int, meter,
              world: Dilated, drafter: str, prompts: list[str]) -> dict:
    """N clients at once in ceil(N / per_process) edge processes; one row, in the undilated
    world's units. meter: the verifier's counters (acespec.sim.bench.Meter)."""

    procs = math.ceil(n / cfg.per_process)
    start_at = time.time() + 3.0 + procs  # every process loads its drafter, then all start
    job = {"host": host, "port": port, "mode": mode, "drafter": drafter, "prompts": prompts,
           "requests": cfg.requests, "max_tokens": cfg.max_tokens,
           "temperature": cfg.temperature, "spec": asdict(world.link),
           "emulate_draft": world.emulate_draft, "stall_s": world.stall_s,
           "backoff_s": world.backoff_s, "start_at": start_at}
    workers = []
    for w in range(procs):
        mine = list(range(w, n, procs))
        workers.append(subprocess.Popen(
            python_module("acespec.sim.load") + [json.dumps({**job, "clients": mine})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        # Lowered at once: the process loads its drafter for seconds before its clients start.
        os.setpriority(os.PRIO_PROCESS, workers[-1].pid, cfg.edge_nice)
    # The verifier's counters before any client starts (a scrape takes a while; the first
    # prompt must not be prefilled meanwhile), the machine's and the sessions' from then on.
    busy0, nodes0, passes0, reach0 = meter.busy(), meter.nodes(), meter.passes(), meter.reach()
    while time.time() < start_at:
        time.sleep(0.01)
    t0, cpu, live = time.perf_counter(), CpuMeter(), SessionSampler(meter)
    records = []
    try:
        for w in workers:
            out, err = w.communicate(timeout=1800 * cfg.dilate)
            if w.returncode:
                raise RuntimeError(f"bench load: an edge process failed ({w.returncode}): "
                                   f"{err[-2000:]}")
            records += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        live.stop()
    cpu_busy = cpu.busy()
    wall = max((r["end"] for r in records), default=start_at) - start_at
    passes = tuple(b - a for a, b in zip(passes0, meter.passes()))
    reach = {le: count - reach0.get(le, 0.0) for le, count in meter.reach().items()}
    row = point(mode, n, records, wall or time.perf_counter() - t0, meter.busy() - busy0,
                meter.nodes() - nodes0, passes, live.mean(), cpu_busy, reach, live.busy_at,
                TIMELINE_S * cfg.dilate)
    return undilate(row, cfg.dilate)


def _progress(r: dict) -> str:
    """A point's line on stderr."""
    live = r["all_live_tok_s"] is not None
    return (f"  per client p50 {r['per_client_tok_s_p50']} / p10 {r['per_client_tok_s_p10']} "
            f"tok/s, aggregate {r['aggregate_tok_s']} tok/s"
            + (f" ({r['all_live_tok_s']} while all live)" if live else "")
            + f", busy {r['verifier_busy']}"
            + (f" ({r['all_live_busy']} while all live)" if r["all_live_busy"] is not None
               else "")
            + (f", turnaround {r['turnaround_share']} ({r['turnaround_ms']} ms a pass)"
               if r["turnaround_ms"] is not None else "")
            + f", {_per_pass(r)}, CPU {r['cpu_busy']}"
            + (" (CPU-bound: not counted)" if r["cpu_bound"] else ""))


def _per_pass(row: dict) -> str:
    """'R of L sessions a pass (D of E decoding)' for the progress line; a point too short
    for the sampler has no live_sessions."""
    live, decode = row["live_sessions"], row["decode_requests_per_pass"]
    if live is None:
        return f"{row['requests_per_pass']} requests a pass ({decode} decoding)"
    return (f"{row['requests_per_pass']} of {live} sessions a pass ({decode} of "
            f"{row['decoding_sessions']} decoding)")


class SessionSampler:
    """The verifier's open sessions and those of them prefilling (Meter.sessions), read
    from its metrics every SAMPLE_S in a thread while a point runs; their means are the
    point's live_sessions. Its busy seconds too, with the wall clock (busy_at: also at the
    start and the stop), for its busy fraction over a part of the point."""

    SAMPLE_S = 0.25

    def __init__(self, meter):
        self.meter, self.samples = meter, []
        self.busy_at: list[tuple[float, float]] = []
        self._read_busy()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read_busy(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.busy_at.append((time.time(), self.meter.busy()))

    def _run(self) -> None:
        while not self._stop.wait(self.SAMPLE_S):
            with contextlib.suppress(OSError, ValueError):
                sessions, prefilling, busy = self.meter.live()
                self.samples.append((sessions, prefilling))
                self.busy_at.append((time.time(), busy))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._read_busy()

    def mean(self) -> tuple[float, float] | None:
        """(open, prefilling) on average; None before the first sample."""
        if not self.samples:
            return None
        return (sum(o for o, _ in self.samples) / len(self.samples),
                sum(p for _, p in self.samples) / len(self.samples))


# -- one edge process: its clients as tasks -------------------------------------------------

def device_pool(clients: int) -> ThreadPoolExecutor:
    """The edge process's worker threads: each client's emulated drafter step is waited out
    in the thread that drafts for it (LlamaDrafterConfig.emulate_apart), so each client
    needs threads of its own for its device to run at the stated step (asyncio's default
    pool has min(32, cores + 4): on two cores, 16 clients would share 6 devices)."""
    return ThreadPoolExecutor(max_workers=2 * clients + 4, thread_name_prefix="device")


async def _clients(job: dict) -> None:


    clients, mode = job["clients"], job["mode"]
    asyncio.get_running_loop().set_default_executor(device_pool(len(clients)))
    seqs = 1 + len(clients) * (1 + GROW_SEQS)
    draft_ms, per_token_ms = job["emulate_draft"]
    drafter = LlamaDrafter(job["drafter"], LlamaDrafterConfig(
        n_seq_max=seqs, n_ctx=max(4096, 768 * len(clients)), emulate_ms=draft_ms,
        emulate_per_token_ms=per_token_ms, emulate_apart=True))  # a device per client
    codec = TextCodec.from_drafter(drafter)
    proxy = ProxyThread(job["host"], job["port"], spec=LinkSpec(**job["spec"]),
                        seed=clients[0])
    via = f"127.0.0.1:{await proxy.start()}"
    ecfg = EngineConfig(mode=mode, adaptive=True, depth=8, window=8,
                        max_depth=8, max_window=32, max_tokens=job["max_tokens"],
                        serve=ServeParams(SamplingParams(job["temperature"], coupled=True)),
                        stall_s=job["stall_s"],
                        backoff_s=job["backoff_s"])
    prompts = [codec.encode(p) for p in job["prompts"]]

    async def client(i: int, slot: int) -> None:
        # Channel arguments of its own: gRPC would otherwise share one connection (one link)
        # among the channels of a process.
        ch = grpc.aio.insecure_channel(via, options=CHANNEL_OPTIONS + [("acespec.client", i)])
        engine = EdgeEngine(lambda: ch, codec.vocab_hash, drafter, owns_channels=False)
        seq = 1 + slot
        branches = list(range(1 + len(clients) + slot * GROW_SEQS,
                              1 + len(clients) + (slot + 1) * GROW_SEQS))
        try:
            for k in range(job["requests"]):
                prompt = prompts[(i + k * 7) % len(prompts)]
                t0, times = time.perf_counter(), []
                _, stats = await engine.generate(prompt, ecfg, _stamp(times), seq=seq,
                                                 branch_seq=branches)
                lone = stats.pass_figures()["lone_tokens"]  # + the first: the prompt's pass
                drafter.drop(seq)
                for b in branches:
                    drafter.drop(b)
                print(json.dumps({"client": i, "tokens": stats.tokens,
                                  "seconds": time.perf_counter() - t0,
                                  "ttft_s": stats.first_token_s, "end": time.time(),
                                  "token_times": [round(t, 4) for t in times],
                                  "lone_tokens": None if lone is None
                                  else lone + min(1, stats.tokens),
                                  "reconnects": stats.reconnects,
                                  **_drafts(stats.verifier)}),
                      flush=True)
        finally:
            await ch.close()

    await asyncio.sleep(max(0.0, job["start_at"] - time.time()))
    try:
        await asyncio.gather(*(client(i, slot) for slot, i in enumerate(clients)))
    finally:
        await proxy.stop()
        drafter.close()


def _stamp(times: list[float]):
    """on_tokens for a generation: appends the wall clock once per token to `times`."""
    return lambda tokens, _: times.extend([time.time()] * len(tokens))


def _reach(reach: dict[float, float]) -> dict:
    """edge_grows_ahead and edge_grow_reach_p50 from Grow messages by reach (cumulative
    {le: count}); None where there were none."""
    total = reach.get(math.inf, 0.0)
    if total <= 0:
        return {"edge_grows_ahead": None, "edge_grow_reach_p50": None}
    median = min(le for le, count in reach.items() if count >= total / 2)
    if math.isinf(median):  # beyond the last bound: at least that
        median = max(le for le in reach if not math.isinf(le))
    return {"edge_grows_ahead": round(1 - reach.get(0.0, 0.0) / total, 3),
            "edge_grow_reach_p50": int(median)}


def _drafts(verifier: dict | None) -> dict:
    """The verifier's account of a generation's edge drafts: received, and scored (reached
    a pass before their positions were decided); {} where it kept none."""
    if not verifier or "drafts_received" not in verifier:
        return {}
    return {"drafts_received": verifier["drafts_received"],
            "drafts_scored": verifier["drafts_scored"]}


if __name__ == "__main__":
    asyncio.run(_clients(json.loads(sys.argv[1])))
