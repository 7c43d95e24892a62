"""Link emulator stages (docs/design.md §7): each maps a chunk's arrival time to its
departure time.

A chunk carries the time it reaches the stage; a stage returns it with the time it leaves,
so stages compose by chaining and never double-count delay. All stages keep FIFO order (a
TCP byte stream cannot reorder). Randomness is passed in as a seeded Generator.
"""

from __future__ import annotations

import bisect
import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Chunk:
    size: int  # bytes
    t: float  # seconds: when the chunk is at the current point of the link


class Rate:
    """Token bucket: `bits_per_s` sustained, up to `burst` bytes sent at once."""

    def __init__(self, bits_per_s: float, burst: int = 0):
        if bits_per_s <= 0:
            raise ValueError(f"rate must be > 0 bit/s, got {bits_per_s}")
        self.bytes_per_s, self.burst = bits_per_s / 8, burst
        self.tokens, self.last, self.free_at = float(burst), 0.0, 0.0

    def __call__(self, c: Chunk) -> Chunk:
        start = max(c.t, self.free_at)
        self.tokens = min(self.burst, self.tokens + (start - self.last) * self.bytes_per_s)
        wait = max(0.0, (c.size - self.tokens) / self.bytes_per_s)
        self.tokens = max(0.0, self.tokens - c.size)
        self.last = self.free_at = start + wait
        return replace(c, t=start + wait)


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


class Trace:
    """Time-varying bandwidth from (time s, kbit/s) steps; serialises chunks like Rate."""

    def __init__(self, steps: list[tuple[float, float]]):
        if not steps or any(k <= 0 for _, k in steps):
            raise ValueError("a trace needs at least one (time, kbit/s > 0) step")
        steps = sorted(steps)
        self.times = [t for t, _ in steps]
        self.rates = [k * 1000 / 8 for _, k in steps]  # bytes/s
        self.free_at = 0.0

    @classmethod
    def from_csv(cls, path: str | Path) -> Trace:
        """CSV rows `time_s,kbps` (a header row is allowed)."""
        rows = []
        with open(path, newline="") as f:
            for row in csv.reader(f):
                try:
                    rows.append((float(row[0]), float(row[1])))
                except (ValueError, IndexError):
                    continue
        return cls(rows)

    def rate_at(self, t: float) -> float:
        return self.rates[max(0, bisect.bisect_right(self.times, t) - 1)]

    def __call__(self, c: Chunk) -> Chunk:
        t, left = max(c.t, self.free_at), float(c.size)
        while left > 0:
            i = max(0, bisect.bisect_right(self.times, t) - 1)
            rate = self.rates[i]
            end = self.times[i + 1] if i + 1 < len(self.times) else float("inf")
            if t + left / rate <= end:
                t += left / rate
                left = 0
            else:
                left -= (end - t) * rate
                t = end
        self.free_at = t
        return replace(c, t=t)


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
    """A symmetric-or-not link: rates in bit/s, times in seconds."""

    up_bps: float
    down_bps: float
    rtt_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    burst: int = 0
    trace: str | None = None  # CSV of time_s,kbps (applies to both directions)

    def build(self, seed: int = 0) -> tuple[Link, Link]:
        """(uplink, downlink) stage chains; each direction gets half the RTT."""
        rng = np.random.default_rng(seed)
        return self._one(self.up_bps, rng), self._one(self.down_bps, rng)

    def _one(self, bps: float, rng: np.random.Generator) -> Link:
        stages = [Trace.from_csv(self.trace) if self.trace else Rate(bps, self.burst),
                  Delay(self.rtt_s / 2)]
        if self.jitter_s:
            stages.append(Jitter(self.jitter_s, rng))
        if self.loss:
            stages.append(Loss(self.loss, rng))
        return Link(*stages)


def parse_rate(text: str) -> float:
    """'50kbit', '10mbit', '1.5Mbps', '64000' -> bits per second."""
    t = text.strip().lower().replace("bps", "bit")
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * mult
    return float(t)


def parse_time(text: str) -> float:
    """'50ms', '0.2s', '0.05' -> seconds."""
    t = text.strip().lower()
    if t.endswith("ms"):
        return float(t[:-2]) / 1000
    if t.endswith("s"):
        return float(t[:-1])
    return float(t)


def simulate(link: Link, chunks: list[Chunk]) -> list[Chunk]:
    """Virtual-clock driver: departure of every chunk, deterministic, no sleeping."""
    return [link(c) for c in chunks]
