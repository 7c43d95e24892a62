"""Trace-driven link stages (docs/design.md §7): a link whose rate, RTT and loss change in steps.

A trace is a CSV of steps `time_s,kbps[,rtt_ms[,loss]]`, each holding from its time to the
next step's; the last step holds for ever. Lines starting with '#' are comments and a header
row is allowed. A step of 0 kbit/s is no link at all (an outage gap): chunks wait for the next
step with a rate. The same steps drive three stages, one per column: `Trace` (rate),
`TraceDelay` (half the step's RTT each way) and `TraceLoss` (retransmission stalls). Shipped
traces live in sim/traces/ (`trace_path`, `shipped_traces`); sim/traces/make_traces.py says
what they are modelled on.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from acespec.sim.link_clock import Chunk, OutageSchedule

if TYPE_CHECKING:
    import numpy as np


COLUMNS = ("time_s", "kbps", "rtt_ms", "loss")


@dataclass(frozen=True)
class TraceSteps:
    """A trace's steps, by column; `rtt_s` and `loss` are None when the file lacks them."""

    times: tuple[float, ...]  # [n] seconds, ascending: when each step begins
    kbps: tuple[float, ...]  # [n] kbit/s, >= 0; 0 = no link during the step
    rtt_s: tuple[float, ...] | None = None  # [n] seconds, round trip
    loss: tuple[float, ...] | None = None  # [n] probability in [0, 1) of a stall per chunk

    def __post_init__(self):
        n = len(self.times)
        if not n:
            raise ValueError("a trace needs at least one step")
        if any(b <= a for a, b in zip(self.times, self.times[1:])):
            raise ValueError("trace step times must be strictly ascending")
        for name in ("kbps", "rtt_s", "loss"):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise ValueError(f"trace column {name} has {len(col)} values for {n} steps")
        if any(k < 0 for k in self.kbps) or self.kbps[-1] <= 0:
            raise ValueError("trace rates must be >= 0 kbit/s and the last step's > 0 "
                             "(it holds for ever)")
        if self.rtt_s is not None and any(r < 0 for r in self.rtt_s):
            raise ValueError("trace RTTs must be >= 0")
        if self.loss is not None and not all(0 <= p < 1 for p in self.loss):
            raise ValueError("trace loss must be in [0, 1)")

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[float]]) -> TraceSteps:
        """Rows (time_s, kbps[, rtt_ms[, loss]]), all of one width, in any order."""
        widths = {len(r) for r in rows}
        if len(widths) > 1 or not widths <= {2, 3, 4}:
            raise ValueError(f"trace rows must all have 2, 3 or 4 columns ({', '.join(COLUMNS)})"
                             f", got widths {sorted(widths)}")
        rows = sorted(tuple(map(float, r)) for r in rows)
        cols = list(zip(*rows)) if rows else [(), ()]
        return cls(cols[0], cols[1],
                   tuple(r / 1000 for r in cols[2]) if len(cols) > 2 else None,
                   cols[3] if len(cols) > 3 else None)

    def index(self, t: float) -> int:
        """The step in force at time t (the first step before the trace starts)."""
        return max(0, bisect.bisect_right(self.times, t) - 1)

    def gaps(self) -> list[tuple[float, float]]:
        """[(start_s, end_s)] of each run of 0-kbit/s steps."""
        out: list[tuple[float, float]] = []
        for i, k in enumerate(self.kbps):
            if k == 0:
                if out and out[-1][1] == self.times[i]:
                    out[-1] = (out[-1][0], self.times[i + 1])
                else:
                    out.append((self.times[i], self.times[i + 1]))
        return out

    @property
    def mean_kbps(self) -> float:
        """Mean rate over the steps, gaps included (kbit/s): a trace link's nominal rate."""
        return sum(self.kbps) / len(self.kbps)

    @property
    def mean_rtt_s(self) -> float | None:
        """Mean RTT over the steps with a rate (seconds); None without an rtt_ms column."""
        if self.rtt_s is None:
            return None
        up = [r for r, k in zip(self.rtt_s, self.kbps) if k > 0]
        return sum(up) / len(up)


def read_trace(path: str | Path) -> TraceSteps:
    """A trace CSV: rows `time_s,kbps[,rtt_ms[,loss]]`, '#' comments, an optional header."""
    rows: list[list[float]] = []
    header_seen = False
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            if rows or header_seen:
                raise ValueError(f"{path}:{n}: not a row of numbers: {line!r}") from None
            header_seen = True
    try:
        return TraceSteps.from_rows(rows)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


TRACES = "traces"  # the shipped traces' folder inside the acespec.sim package


def shipped_traces() -> tuple[str, ...]:
    """Names of the traces shipped in sim/traces/ (file names without .csv)."""
    folder = resources.files("acespec.sim").joinpath(TRACES)
    return tuple(sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".csv")))


def trace_path(name: str) -> Path:
    """The file of a shipped trace, by name ('lte', 'wifi-handover')."""
    names = shipped_traces()
    if name not in names:
        raise ValueError(f"unknown trace {name!r}; shipped traces: {', '.join(names)}")
    return Path(str(resources.files("acespec.sim").joinpath(TRACES).joinpath(f"{name}.csv")))


def find_trace(name_or_path: str) -> Path:
    """A shipped trace's name or a CSV's path -> the file."""
    if name_or_path in shipped_traces():
        return trace_path(name_or_path)
    p = Path(name_or_path)
    if not p.is_file():
        raise ValueError(f"no trace {name_or_path!r}: not a file, nor a shipped trace "
                         f"({', '.join(shipped_traces())})")
    return p


class Trace:
    """Rate from the trace's kbps column; serialises chunks like Rate. A 0-kbit/s step, and a
    window of `outages`, carry nothing: a chunk's sending pauses until the link is back."""

    def __init__(self, steps: TraceSteps | Sequence[Sequence[float]],
                 outages: OutageSchedule | None = None):
        self.steps = steps if isinstance(steps, TraceSteps) else TraceSteps.from_rows(steps)
        self.times = list(self.steps.times)  # [n] seconds
        self.rates = [k * 1000 / 8 for k in self.steps.kbps]  # [n] bytes/s
        self.outages = outages
        self.free_at = 0.0  # seconds: when the sender is done with what it has

    @classmethod
    def from_csv(cls, path: str | Path) -> Trace:
        """From a trace CSV (see `read_trace`)."""
        return cls(read_trace(path))

    def rate_at(self, t: float) -> float:
        """Bytes/s at time t (seconds)."""
        return self.rates[self.steps.index(t)]

    def __call__(self, c: Chunk) -> Chunk:
        t, left = max(c.t, self.free_at), float(c.size)
        while left > 0:
            if self.outages is not None:
                t = self.outages.back_at(t)
            i = self.steps.index(t)
            end = self.times[i + 1] if i + 1 < len(self.times) else float("inf")
            if self.outages is not None:
                end = min(end, self.outages.next_start(t))
            rate = self.rates[i]
            if rate > 0 and t + left / rate <= end:
                t, left = t + left / rate, 0.0
            else:  # the step (or the link) ends first: send what fits, go on from there
                left -= (end - t) * rate
                t = end
        self.free_at = t
        return replace(c, t=t)


class TraceDelay:
    """One-way propagation delay from the trace's rtt_ms column: half the RTT of the step in
    force when the chunk leaves the sender. FIFO kept when the RTT falls."""

    def __init__(self, steps: TraceSteps):
        if steps.rtt_s is None:
            raise ValueError("TraceDelay needs a trace with an rtt_ms column")
        self.steps, self.prev = steps, 0.0

    def __call__(self, c: Chunk) -> Chunk:
        self.prev = max(self.prev, c.t + self.steps.rtt_s[self.steps.index(c.t)] / 2)
        return replace(c, t=self.prev)


class TraceLoss:
    """Loss from the trace's loss column, as retransmission stalls (like Loss): with the
    step's probability a chunk waits one retransmission timeout, max(`rto`, the step's RTT)
    seconds, again if the retransmission is lost too, and everything behind it waits (FIFO).
    Nothing is dropped."""

    def __init__(self, steps: TraceSteps, rng: np.random.Generator, rto: float = 0.2):
        if steps.loss is None:
            raise ValueError("TraceLoss needs a trace with a loss column")
        self.steps, self.rng, self.rto, self.prev = steps, rng, rto, 0.0
        self.stalls = 0

    def __call__(self, c: Chunk) -> Chunk:
        i = self.steps.index(c.t)
        p, t = self.steps.loss[i], c.t
        if p > 0:
            stall = max(self.rto, self.steps.rtt_s[i] if self.steps.rtt_s else 0.0)
            while self.rng.random() < p:
                t += stall
                self.stalls += 1
        self.prev = max(self.prev, t)
        return replace(c, t=self.prev)
