"""Link emulator stages (docs/design.md §7): each maps a chunk's arrival time to its
departure time.

A chunk carries the time it reaches the stage; a stage returns it with the time it leaves,
so stages compose by chaining and never double-count delay. All stages keep FIFO order (a
TCP byte stream cannot reorder). Randomness is passed in as a seeded Generator. The trace
stages (rate, RTT and loss in steps from a CSV) live in acespec.sim.trace, the chunk and the
outage schedule in acespec.sim.link_clock; both are re-exported here.

Outages: an `OutageSchedule` holds the windows when a link is down; one schedule is shared by
both directions (and, in the proxy, by every connection), and it can grow while the link runs.
During a window the sender (Rate, Trace) sends nothing, and what was already on the wire when
it began is lost and retransmitted once the link is back (the `Outage` stage at the far end).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from acespec.sim.link_clock import Chunk, OutageSchedule
from acespec.sim.trace import (
    Trace,
    TraceDelay,
    TraceLoss,
    TraceSteps,
    find_trace,
    read_trace,
    shipped_traces,
    trace_path,
)

__all__ = ["Chunk", "OutageSchedule", "Outage", "Rate", "Delay", "Jitter", "Loss", "Trace",
           "TraceDelay", "TraceLoss", "TraceSteps", "Link", "LinkSpec", "find_trace",
           "read_trace", "shipped_traces", "trace_path", "parse_rate", "parse_time",
           "parse_outage", "simulate"]


class Outage:
    """The link is down during the schedule's windows: a chunk that reaches the stage inside
    one leaves at its end (TCP retransmits what was dropped once the link is back). FIFO kept.
    Placed at the far end of a chain, it catches what was on the wire when the link went."""

    def __init__(self, windows: OutageSchedule | list[tuple[float, float]]):
        self.schedule = windows if isinstance(windows, OutageSchedule) else OutageSchedule(windows)
        self.prev = 0.0

    def __call__(self, c: Chunk) -> Chunk:
        self.prev = max(self.prev, self.schedule.back_at(c.t))
        return replace(c, t=self.prev)


class Rate:
    """Token bucket: `bits_per_s` sustained, up to `burst` bytes sent at once. With
    `outages`, nothing is sent during their windows (the chunk's sending pauses)."""

    def __init__(self, bits_per_s: float, burst: int = 0,
                 outages: OutageSchedule | None = None):
        if bits_per_s <= 0:
            raise ValueError(f"rate must be > 0 bit/s, got {bits_per_s}")
        self.bytes_per_s, self.burst, self.outages = bits_per_s / 8, burst, outages
        self.tokens, self.last, self.free_at = float(burst), 0.0, 0.0

    def __call__(self, c: Chunk) -> Chunk:
        start = max(c.t, self.free_at)
        if self.outages is not None:
            start = self.outages.back_at(start)
        self.tokens = min(self.burst, self.tokens + (start - self.last) * self.bytes_per_s)
        wait = max(0.0, (c.size - self.tokens) / self.bytes_per_s)
        self.tokens = max(0.0, self.tokens - c.size)
        done = self.outages.transmit(start, wait) if self.outages is not None else start + wait
        self.last = self.free_at = done
        return replace(c, t=done)


class Delay:
    """One-way propagation delay."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, c: Chunk) -> Chunk:
        return replace(c, t=c.t + self.seconds)


class Jitter:
    """Extra delay uniform in [0, seconds], FIFO preserved."""

    def __init__(self, seconds: float, rng: np.random.Generator):
        self.seconds, self.rng, self.prev = seconds, rng, 0.0

    def __call__(self, c: Chunk) -> Chunk:
        self.prev = max(self.prev, c.t + self.rng.random() * self.seconds)
        return replace(c, t=self.prev)


class Loss:
    """A lost segment is retransmitted after `rto` seconds: modelled as a stall of that
    chunk and, by head-of-line blocking, of everything behind it. Nothing is dropped."""

    def __init__(self, probability: float, rng: np.random.Generator, rto: float = 0.2):
        if not 0 <= probability < 1:
            raise ValueError(f"loss probability must be in [0, 1), got {probability}")
        self.p, self.rng, self.rto, self.prev = probability, rng, rto, 0.0
        self.stalls = 0

    def __call__(self, c: Chunk) -> Chunk:
        t = c.t
        while self.rng.random() < self.p:  # the retransmission can be lost too
            t += self.rto
            self.stalls += 1
        self.prev = max(self.prev, t)
        return replace(c, t=self.prev)


class Link:
    """One direction: a chain of stages."""

    def __init__(self, *stages):
        self.stages = stages

    def __call__(self, c: Chunk) -> Chunk:
        for s in self.stages:
            c = s(c)
        return c


@dataclass(frozen=True)
class LinkSpec:
    """A symmetric-or-not link: rates in bit/s, times in seconds.

    A trace applies to both directions and replaces what it has columns for: the rates
    always, the RTT and the loss where it has rtt_ms and loss columns."""

    up_bps: float
    down_bps: float
    rtt_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    burst: int = 0
    trace: str | None = None  # CSV path: time_s,kbps[,rtt_ms[,loss]] (acespec.sim.trace)
    outages: tuple[tuple[float, float], ...] = ()  # (start_s, duration_s) from the link's start

    def __post_init__(self):  # JSON round trips (bench load) hand lists back: normalise
        object.__setattr__(self, "outages", tuple((float(s), float(d)) for s, d in self.outages))
        OutageSchedule.of(self.outages)  # validates

    def build(self, seed: int = 0, outages: OutageSchedule | None = None) -> tuple[Link, Link]:
        """(uplink, downlink) stage chains; each direction gets half the RTT. Both share one
        outage schedule: `outages` if given (a proxy's, which can grow), else this spec's."""
        rng = np.random.default_rng(seed)
        if outages is None and self.outages:
            outages = OutageSchedule.of(self.outages)
        steps = read_trace(self.trace) if self.trace else None
        return (self._one(self.up_bps, rng, steps, outages),
                self._one(self.down_bps, rng, steps, outages))

    def _one(self, bps: float, rng: np.random.Generator, steps: TraceSteps | None,
             outages: OutageSchedule | None) -> Link:
        stages: list = [Trace(steps, outages) if steps else Rate(bps, self.burst, outages),
                        TraceDelay(steps) if steps and steps.rtt_s else Delay(self.rtt_s / 2)]
        if self.jitter_s:
            stages.append(Jitter(self.jitter_s, rng))
        if steps and steps.loss:
            stages.append(TraceLoss(steps, rng))
        elif self.loss:
            stages.append(Loss(self.loss, rng))
        if outages is not None:
            stages.append(Outage(outages))
        return Link(*stages)


def _number(text: str, what: str, example: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"bad {what} {example}") from None


def parse_rate(text: str) -> float:
    """'50kbit', '10mbit', '1.5Mbps', '64000' -> bits per second."""
    t = text.strip().lower().replace("bps", "bit")
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], mult
            break
    else:
        scale = 1.0
    return _number(t, "rate", f"{text!r} (e.g. 50kbit, 10mbit, 64000)") * scale


def parse_time(text: str) -> float:
    """'50ms', '0.2s', '0.05' -> seconds."""
    t, scale = text.strip().lower(), 1.0
    if t.endswith("ms"):
        t, scale = t[:-2], 1e-3
    elif t.endswith("s"):
        t = t[:-1]
    return _number(t, "time", f"{text!r} (e.g. 50ms, 0.2s, 0.05)") * scale


def parse_outage(text: str) -> tuple[float, float]:
    """'10:5', '10s:500ms' -> (start_s, duration_s): down from START for DURATION."""
    start, sep, duration = text.partition(":")
    if not sep:
        raise ValueError(f"bad outage {text!r} (expected START:DURATION, e.g. 10:5)")
    out = parse_time(start), parse_time(duration)
    if out[0] < 0 or out[1] <= 0:
        raise ValueError(f"bad outage {text!r}: start must be >= 0 and duration > 0")
    return out


def simulate(link: Link, chunks: list[Chunk]) -> list[Chunk]:
    """Virtual-clock driver: departure of every chunk, deterministic, no sleeping."""
    return [link(c) for c in chunks]
