"""The real-system benchmark (docs/design.md §8): verifier, emulated link and edge, every mode on
every prompt through the same link, side by side in one run.

Wire bytes are counted at the link proxy's sockets (HTTP/2 and gRPC framing included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import urlencode
from urllib.request import urlopen

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
from acespec.edge.session import EdgeEngine, EngineConfig, Stats
from acespec.edge.session.config import MAX_DEPTH, MAX_WINDOW
from acespec.edge.text import TextCodec
from acespec.procs import free_port, python_module, wait_port
from acespec.proto.sizes import naive_bytes
from acespec.shared import modes
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams
from acespec.sim.netns import NetnsLink, available
from acespec.sim.stages import (
    LinkSpec,
    find_trace,
    parse_outage,
    parse_rate,
    parse_time,
    read_trace,
)
from acespec.sim.timeline import Screen, link_cycle_s, links

CLOUD_DRAFT_MS = "5,0.05"  # colo's draft step, see BenchConfig.cloud_draft


@dataclass(frozen=True)
class BenchConfig:
    links: tuple[tuple[str, LinkSpec], ...]  # (label, spec)
    modes: tuple[str, ...] = modes.BENCH_DEFAULT  # names in acespec.shared.modes.MODES
    max_tokens: int = 64
    depth: int = 4
    window: int = 16
    adaptive: bool = False  # pipeline/acespec: depth and window follow the link
    netns: bool = False  # shape with tc tbf in a network namespace (root) instead of the proxy
    temperature: float = 0.0
    sampling: str = "coupled"  # with temperature > 0: "coupled" | "exact"
    emulate: str | None = "40,0.5"  # the verifier's --emulate-step-ms (None: its own passes)
    emulate_draft: tuple[float, float] = (0.0, 0.0)  # the edge's --emulate-draft-ms profile
    # The verifier runs in its own process, as it would on its own machine: in this one, the
    # edge's drafting (and its emulated step time) would hold the verifier's event loop.
    inline_verifier: bool = False
    per_category: int = 10  # prompts per category
    seed: int = 0
    propose: int = 8  # the verifier's --propose (its own proposals in passes no draft covers)
    gap_drafter: str = ""  # acespec-gap, colo: the verifier's --gap-drafter (others: off)
    # The verifier's --emulate-cloud-draft-ms: a co-located draft step on the target's
    # device. 5 ms is an eighth of the 40 ms target step of the default profile: a 1B-class
    # draft model beside a 70B-class target at low batch, where a few draft steps add
    # 10-30 % to each target step (vLLM's disaggregated-drafting RFC). Per session 0.05 ms.
    cloud_draft: str = CLOUD_DRAFT_MS
    dtype: str = "float32"  # the verifier's --dtype (every mode: `ar` runs the same target)
    linear: str = "auto"  # the verifier's --linear (every mode)
    dilate: float = 1.0  # the verifier's --emulate-dilate (bench load --dilate)

    def __post_init__(self):
        if not 1 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"--depth {self.depth} must be in [1, {MAX_DEPTH}]")
        if not self.depth <= self.window <= MAX_WINDOW:
            raise ValueError(f"--window {self.window} must be in [--depth {self.depth}, "
                             f"{MAX_WINDOW}]")
        if self.max_tokens < 1:
            raise ValueError(f"--max-tokens {self.max_tokens} must be >= 1")
        if self.netns and any(link_cycle_s(spec) is not None for _, spec in self.links):
            raise ValueError("--netns shapes a fixed rate with tc: run traces and outages "
                             "through the link emulator (without --netns)")
        modes.check(self.modes, who="acespec bench")
        if self.gap and not self.gap_drafter:
            gap = [m for m in modes.NAMES if modes.MODES[m].gap]
            raise ValueError(f"modes {' and '.join(gap)} need --gap-drafter")
        rivals = [m for m in self.modes if modes.MODES[m].drafts == "verifier"]
        if rivals and self.temperature > 0 and self.sampling != "coupled":
            raise ValueError(f"modes {', '.join(rivals)} need greedy or coupled sessions (the "
                             "verifier decides them); --sampling exact has the edge decide")

    @property
    def gap(self) -> bool:
        """The bench's verifier runs a gap drafter (a mode with one is asked for)."""
        return any(modes.MODES[m].gap for m in self.modes)

    def serve_flags(self) -> list[str]:
        """`acespec cloud serve` flags of the bench's verifier (besides host and port)."""
        gap = (["--gap-drafter", self.gap_drafter, "--emulate-cloud-draft-ms",
                self.cloud_draft] if self.gap else [])
        step = ["--emulate-step-ms", self.emulate] if self.emulate else []  # else its own
        return step + ["--grace", "1", "--propose", str(self.propose), "--dtype", self.dtype,
                       "--linear", self.linear, "--emulate-dilate", f"{self.dilate:g}"] + gap


def parse_links(text: str) -> tuple[tuple[str, LinkSpec], ...]:
    """'50kbit:50ms,10mbit:10ms' -> ((label, LinkSpec), ...), labelled as written.

    'none'/'loopback': no shaping. 'trace:NAME[:RTT]' or 'trace:PATH.csv[:RTT]': a shipped
    trace or a CSV (acespec.sim.trace); its rates, and its RTT and loss where it has those
    columns (RTT only for a trace without one); the spec's rate and RTT are then the trace's
    means. Any link may end in '+outage=START:DURATION' (seconds, repeatable): down both ways.
    """
    out = []
    for part in (p.strip() for p in text.split(",")):
        head, *suffixes = part.split("+")
        base = head.strip()
        try:
            outages = []
            for suffix in suffixes:
                key, _, value = suffix.partition("=")
                if key.strip() != "outage":
                    raise ValueError(f"unknown '+{suffix}' (expected +outage=START:DURATION)")
                outages.append(parse_outage(value))
            if base in ("none", "loopback"):
                spec = LinkSpec(1e12, 1e12, 0.0, outages=tuple(outages))
            elif base.startswith("trace:"):
                name, _, rtt = base[len("trace:"):].partition(":")
                path = find_trace(name)
                steps = read_trace(path)
                if rtt and steps.rtt_s is not None:
                    raise ValueError(f"trace {name!r} has its own rtt_ms column; drop ':{rtt}'")
                bps = steps.mean_kbps * 1000
                spec = LinkSpec(bps, bps, steps.mean_rtt_s or parse_time(rtt or "0ms"),
                                trace=str(path), outages=tuple(outages))
            else:
                rate, _, rtt = base.partition(":")
                bps = parse_rate(rate)
                spec = LinkSpec(bps, bps, parse_time(rtt or "0ms"), outages=tuple(outages))
        except (ValueError, OSError) as e:
            raise ValueError(f"link {part!r}: {e}") from None
        out.append(("loopback" + part[len(head):] if base in ("none", "loopback") else part,
                    spec))
    return tuple(out)


def load_prompts(path: str | None = None, per_category: int = 10) -> list[dict]:
    """The shipped prompt set (5 categories x 10) or a JSONL of {id, category, prompt}."""
    text = Path(path).read_text() if path else \
        resources.files("acespec.sim").joinpath("data/bench_prompts.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    seen: dict[str, int] = {}
    keep = []
    for r in rows:
        if seen.get(r["category"], 0) < per_category:
            seen[r["category"]] = seen.get(r["category"], 0) + 1
            keep.append(r)
    return keep


async def run_bench(cfg: BenchConfig, model_dir: str, drafter_path: str,
                    prompts: list[dict], progress=None) -> list[dict]:
    """One record per (link, mode, prompt)."""

    drafter = LlamaDrafter(drafter_path, LlamaDrafterConfig(
        n_seq_max=8, emulate_ms=cfg.emulate_draft[0], emulate_per_token_ms=cfg.emulate_draft[1]))
    codec = TextCodec.from_drafter(drafter)
    state = {"records": [], "total": len(cfg.links) * len(cfg.modes) * len(prompts), "done": 0}
    serve = (_verifier_in_netns if cfg.netns else
             _verifier_in_process if cfg.inline_verifier else _verifier_process)
    async with serve(cfg, model_dir) as start:
        for label, spec in cfg.links:
            async with start(spec) as (host, port, proxy_spec, meter):
                await _bench_link(cfg, label, spec, host, port, proxy_spec, drafter, codec,
                                  prompts, state, progress, meter.busy)
    drafter.close()
    return state["records"]


METRICS_PORT = 9464  # the verifier's --metrics-port inside a network namespace


class Meter:
    """What the bench reads of its verifier's counters: from its /metrics (a verifier
    process), or from the engine (one in this process)."""

    def __init__(self, host: str = "", port: int = 0, engine=None):
        self.url, self.engine = f"http://{host}:{port}/metrics", engine

    def _samples(self, *names: str) -> list:
        """The named samples of the verifier's metrics, from one scrape of those alone (or its
        registry): a whole page takes the verifier's interpreter for milliseconds, which the
        bench, reading a few figures several times a second, would take from its passes."""
        if self.engine is not None:
            registry = self.engine.metrics.registry if self.engine.metrics else None
            families = registry.restricted_registry(names).collect() if registry else []
        else:
            with urlopen(f"{self.url}?{urlencode([('name[]', n) for n in names])}",
                         timeout=5) as r:
                families = text_string_to_metric_families(r.read().decode())
        return [x for f in families for x in f.samples]

    def _counter(self, *names: str) -> float | tuple[float, ...]:
        """The named samples' sums, from one scrape (so that counters read together agree)."""
        samples = self._samples(*names)
        sums = tuple(sum(x.value for x in samples if x.name == n) for n in names)
        return sums[0] if len(names) == 1 else sums

    def reach(self) -> dict[float, float]:
        """The edges' Grow messages applied so far by their reach, cumulative: {le: how
        many reached at most le positions past the decided end} from the buckets of
        acespec_edge_grow_reach (le inf: all of them)."""
        name = "acespec_edge_grow_reach_bucket"
        return {float(x.labels["le"]): x.value for x in self._samples(name) if x.name == name}

    def busy(self) -> float:
        """Seconds the verifier was busy so far: its passes and its drafting."""
        if self.engine is not None:
            gap = self.engine.gap.busy_s if self.engine.gap else 0.0
            return self.engine.batcher.busy_s + gap
        return self._counter("acespec_busy_seconds_total")

    def live(self) -> tuple[float, float, float]:
        """(sessions(), busy()) from one scrape: what SessionSampler reads while a point
        runs, so it scrapes the verifier once a sample, not twice."""
        if self.engine is not None:
            return (*self.sessions(), self.busy())
        return self._counter("acespec_sessions_active", "acespec_sessions_prefilling",
                             "acespec_busy_seconds_total")

    def nodes(self) -> float:
        """Nodes the verifier scored so far."""
        if self.engine is not None:
            return float(self.engine.metrics.nodes_scored._value.get()) \
                if self.engine.metrics else 0.0
        return self._counter("acespec_nodes_scored_total")

    def rss(self) -> float:
        """The verifier process's resident bytes now (a verifier process only)."""
        return self._counter("process_resident_memory_bytes")

    def sessions(self) -> tuple[float, float]:
        """(sessions and Generate calls open at the verifier now, those of them whose
        prompt a pass has yet to finish)."""
        if self.engine is not None:
            return float(self.engine.active), float(self.engine.batcher.prefilling)
        return self._counter("acespec_sessions_active", "acespec_sessions_prefilling")

    def passes(self) -> tuple[float, float, float, float]:
        """(passes so far, the requests they held, of those the chunks of prompts; summed
        over the passes; the seconds the device waited between them while their sessions
        queued again)."""
        if self.engine is not None:
            m = self.engine.metrics
            return (float(m.passes._value.get()), float(m.batch_sessions._sum.get()),
                    float(m.prefill_chunks._value.get()),
                    float(m.turnaround_seconds._value.get())) if m else (0.0,) * 4
        return self._counter("acespec_passes_total", "acespec_batch_sessions_sum",
                             "acespec_prefill_chunks_total", "acespec_turnaround_seconds_total")


@contextlib.asynccontextmanager
async def _verifier_in_process(cfg: BenchConfig, model_dir: str):
    """One verifier in this process for every link; the proxy does all the shaping."""
    # lazy: the verifier's modules import torch (the cloud extra's)
    from acespec.cloud.serving.server import ServerConfig, create_server, load_engine
    from acespec.cloud.verify.batcher import StepEmulation
    from acespec.cloud.verify.engine import Limits
    from acespec.cloud.verify.gap import DraftEmulation

    scfg = ServerConfig(model=model_dir, host="127.0.0.1", port=0,
                        emulation=StepEmulation.parse(cfg.emulate, cfg.dilate),
                        limits=Limits(propose=cfg.propose),
                        gap_drafter=cfg.gap_drafter if cfg.gap else "",
                        cloud_draft=DraftEmulation.parse(cfg.cloud_draft))
    engine = load_engine(scfg)
    server, port = await create_server(engine, scfg)

    @contextlib.asynccontextmanager
    async def start(spec):
        yield "127.0.0.1", port, spec, Meter(engine=engine)

    try:
        yield start
    finally:
        await server.stop(0)
        await engine.close_all()


@contextlib.asynccontextmanager
async def _verifier_process(cfg: BenchConfig, model_dir: str):
    """One `acespec cloud serve` process for every link (half the cores: the edge shares the
    machine); the proxy does all the shaping."""
    port, metrics = free_port(), free_port()
    argv = [*python_module("acespec"), "cloud", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--metrics-port", str(metrics), *cfg.serve_flags(),
            "--threads", str(max(1, (os.cpu_count() or 2) // 2))]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv + (["--model", model_dir] if model_dir else []),
                            stdout=log, stderr=subprocess.STDOUT)

    @contextlib.asynccontextmanager
    async def start(spec):
        yield "127.0.0.1", port, spec, Meter("127.0.0.1", metrics)

    try:
        try:
            await asyncio.to_thread(wait_port, port, proc, "verifier", 300.0)
        except RuntimeError as e:
            log.seek(0)
            raise RuntimeError(f"{e}: {log.read()[-500:]!r}") from e
        yield start
    finally:
        _stop(proc, log)


def _stop(proc, log) -> None:
    """SIGTERM the verifier (its graceful stop), SIGKILL after 15 s; close its log."""

    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@contextlib.asynccontextmanager
async def _verifier_in_netns(cfg: BenchConfig, model_dir: str):
    """Per link: a network namespace whose veth is shaped by tc tbf, the verifier running
    inside it; the proxy in front only delays (tc has no netem here) and counts."""


    port = 50051  # the verifier's, inside its own namespace
    why = available()
    if why:
        raise RuntimeError(f"--netns: {why}")

    @contextlib.asynccontextmanager
    async def start(spec):
        with NetnsLink(spec.up_bps, spec.down_bps) as ns:
            argv = [*python_module("acespec"), "cloud", "serve", "--host", ns.cloud_ip,
                    "--port", str(port), "--metrics-port", str(METRICS_PORT),
                    *cfg.serve_flags()]
            log = tempfile.TemporaryFile()
            proc = subprocess.Popen(ns.argv_in_ns(argv + (["--model", model_dir] if model_dir
                                                          else [])),
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                try:
                    await asyncio.to_thread(wait_port, port, proc, "verifier in the namespace",
                                            120.0, ns.cloud_ip)
                except RuntimeError as e:
                    log.seek(0)
                    raise RuntimeError(f"{e}: {log.read()[-500:]!r}") from e
                yield (ns.cloud_ip, port, LinkSpec(1e12, 1e12, spec.rtt_s, spec.jitter_s),
                       Meter(ns.cloud_ip, METRICS_PORT))
            finally:
                _stop(proc, log)

    yield start


RECONNECT_DEADLINE_S = 60.0  # a run rides out any outage a shipped trace has


async def _bench_link(cfg, label, spec, host, port, proxy_spec, drafter, codec, prompts,
                      state, progress, busy) -> None:

    sampling = cfg.sampling if cfg.temperature > 0 else "coupled"  # greedy: as the mode has it
    async with links(cfg.seed, host, port, proxy_spec) as link_for:
        for mode in cfg.modes:
            for i, p in enumerate(prompts):
                ecfg = EngineConfig(mode=mode, sampling=sampling, depth=cfg.depth,
                                    window=cfg.window,
                                    adaptive=cfg.adaptive, max_depth=max(8, cfg.depth),
                                    max_window=max(32, cfg.window),
                                    serve=ServeParams(SamplingParams(
                                        cfg.temperature, coupled=cfg.sampling == "coupled")),
                                    seed=cfg.seed, max_tokens=cfg.max_tokens,
                                    reconnect_deadline_s=RECONNECT_DEADLINE_S)
                async with link_for(i / len(prompts)) as (proxy, ch):
                    edge = EdgeEngine(lambda ch=ch: ch, codec.vocab_hash,
                                      drafter if ecfg.spec.edge_drafts else None,
                                      owns_channels=False)
                    rec = await _run_one(edge, ecfg, codec.encode(p["prompt"]), proxy, busy)
                rec = {**_record(label, spec, mode, p, rec.pop("stats"), rec.pop("stamps"),
                                 rec.pop("t0"), rec.pop("up"), rec.pop("down"),
                                 drafter.vocab_size), **rec}
                state["records"].append(rec)
                state["done"] += 1
                if progress:
                    progress(state["done"], state["total"], label, mode, p["id"])


async def _run_one(edge, ecfg, prompt: list[int], proxy, busy) -> dict:
    """One generation, timed as its user sees it (Screen); a run that fails counts its
    tokens as lost."""
    before = (proxy.counts.up, proxy.counts.down)
    busy0 = await asyncio.to_thread(busy)
    screen = Screen(ecfg.max_tokens)
    t0 = time.perf_counter()
    error = None
    try:
        out, stats = await edge.generate(prompt, ecfg, screen.verified, on_event=screen.event)
    except OSError as e:  # ConnectionError: the verifier never came back

        out, stats, error = [], Stats(seconds=time.perf_counter() - t0), str(e)
    return {"stats": stats, "stamps": screen.stamps, "t0": t0,
            "up": proxy.counts.up - before[0], "down": proxy.counts.down - before[1],
            "token_ids": list(out), "verifier_s": round(await asyncio.to_thread(busy) - busy0, 4),
            "tokens_lost": ecfg.max_tokens - len(out) - len(stats.unverified_tail),
            "longest_gap_s": screen.longest_gap(), "error": error}


def _record(label, spec, mode, p, stats, stamps, t0, up, down, vocab: int) -> dict:
    gaps = np.diff(stamps) * 1000 if len(stamps) > 1 else np.zeros(1)
    n = max(stats.tokens, 1)
    naive_up, naive_down = naive_bytes(stats.drafted, stats.passes, vocab) \
        if modes.mode(mode).edge_drafts else (None, None)  # naive: edge-cloud speculation
    return {"link": label, "up_bps": spec.up_bps, "rtt_ms": spec.rtt_s * 1000, "mode": mode,
            "category": p["category"], "prompt": p["id"], **{
                k: v for k, v in stats.as_dict().items() if k not in ("wire_bytes_up",
                                                                     "wire_bytes_down")},
            "wire_bytes_up": up, "wire_bytes_down": down,
            "wire_bytes_up_per_token": round(up / n, 2),
            "wire_bytes_down_per_token": round(down / n, 2),
            "naive_bytes_up": naive_up, "naive_bytes_down": naive_down,
            "ttft_s": round(stamps[0] - t0, 4) if stamps else None,
            "from_edge_drafts": stats.accepted,
            "itl_p50_ms": round(float(np.percentile(gaps, 50)), 2),
            "itl_p99_ms": round(float(np.percentile(gaps, 99)), 2)}


def progress_bar(done: int, total: int, link: str, mode: str, prompt: str) -> None:
    width = 30
    filled = int(width * done / total)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                     f"{link} {mode} {prompt:<14}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
