"""Adaptive draft depth and window, and link-derived branch budgets (docs/design.md §6).

`LinkEstimate` follows what the edge can see of the link: each Extend's round trip (sent ->
its Scores), the verifier's own time in it (each Scores carries it: queue + pass), and the
bytes of both messages. The network time rtt - server time is modelled as
base + bytes / bandwidth; the verifier's pass time is its smallest recent time. Sliding
windows let all three follow a link whose bandwidth changes mid-generation.

`choose_shape` is the closed form of the pipeline's speedup model: with per-position
acceptance a, a window of W live nodes yields 1 + sum_{i<=W} a^i tokens per verdict cycle
(accepted drafts plus the recovered token), and a cycle costs the base round trip plus the
serialisation of what the window puts on the link (W nodes and one message header per chunk
of d, each way), plus half a verifier pass per extra chunk (after a rejection the new chain
waits, on average, for half of a pass that scores dead drafts). Among a small grid of (d, W) it takes the best tokens per second; it moves
only when the model predicts a gain of over 10 % (hysteresis keeps it stable under noise).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from acespec.proto.sizes import (
    DOWN_NODE_GREEDY,
    DOWN_SCORES_MESSAGE,
    FRAMING,
    UP_EXTEND_MESSAGE,
    UP_NODE,
)

CHUNK_BYTES = 2 * FRAMING + UP_EXTEND_MESSAGE + DOWN_SCORES_MESSAGE  # an Extend and its Scores
FITS = 7  # the bandwidth is the median of the link fits after this many recent exchanges


@dataclass
class LinkEstimate:
    samples: deque = field(default_factory=lambda: deque(maxlen=24))  # (bytes, network_s)
    server: deque = field(default_factory=lambda: deque(maxlen=24))  # verifier time, s
    arrivals: deque = field(default_factory=lambda: deque(maxlen=16))  # (time, down bytes)
    fits: deque = field(default_factory=lambda: deque(maxlen=FITS))  # a fit per exchange
    _bw: float | None = None  # bandwidth() of the current fits
    floor: float = float("inf")  # the session's least network time of an exchange, s

    def observe(self, bytes_up: int, bytes_down: int, rtt_s: float, server_s: float,
                now: float | None = None) -> None:
        """One Extend's exchange: its round trip, the verifier's own time in it (queue +
        pass, from the Scores), the bytes of both messages and the Scores' arrival time."""
        self.samples.append((float(bytes_up + bytes_down), max(0.0, rtt_s - server_s)))
        self.floor = min(self.floor, self.samples[-1][1])
        self._bw = None
        self.server.append(float(server_s))
        if self.ready:
            b, t = np.array(self.samples).T
            self.fits.append(min(self._envelope(), self._floor_rate(b, t)))
        if now is not None:
            self.arrivals.append((float(now), float(bytes_down)))

    def throughput(self) -> float:
        """Downlink bytes per second over the recent arrivals (0 if too few): the link's
        rate when it is the bottleneck, a lower bound otherwise."""
        if len(self.arrivals) < 4:
            return 0.0
        span = self.arrivals[-1][0] - self.arrivals[0][0]
        return sum(b for _, b in list(self.arrivals)[1:]) / span if span > 0 else 0.0

    @property
    def ready(self) -> bool:
        return len(self.samples) >= 4

    def step(self) -> float:
        """The verifier's pass time: its least recent time per Extend (no queue)."""
        return min(self.server) if self.server else 0.0

    def base_rtt(self) -> float:
        """Network round trip of an empty exchange (seconds): the smallest recent network
        time less its own serialisation."""
        if not self.samples:
            return 0.1
        bw = self.bandwidth()
        return max(1e-4, min(t - b / bw for b, t in self.samples))

    def bandwidth(self) -> float:
        """Bytes per second (one figure for both directions): from the slope of the lower
        envelope of network time against bytes (the least-queued exchanges: a line fit,
        refitted twice to the points on or below it; 1e9 when time does not grow with
        bytes), the median of the fits after each of the last FITS exchanges (one fit of
        near-equal messages on a loaded link can read a slope ten times too flat, and a
        budget sized from it floods the link), but never below the measured downlink
        throughput (a saturated link queues every exchange, which steepens the slope)."""
        if self._bw is None:
            fit = float(np.median(self.fits)) if self.fits else self._envelope()
            self._bw = max(fit, self.throughput())
        return self._bw

    def _envelope(self) -> float:
        if len(self.samples) < 4:
            return 1e9
        b, t = np.array(self.samples).T
        keep = np.ones(len(b), bool)
        for _ in range(3):
            if keep.sum() < 3 or np.ptp(b[keep]) < 8:
                return self._floor_rate(b, t)
            slope, icpt = np.polyfit(b[keep], t[keep], 1)
            resid = t - (slope * b + icpt)
            keep = resid <= np.median(resid[keep])
        return float(np.clip(1.0 / slope, 1e3, 1e9)) if slope > 1e-9 else self._floor_rate(b, t)

    def _floor_rate(self, b: np.ndarray, t: np.ndarray) -> float:
        """Where the envelope cannot tell (messages of near-equal size spaced out in time, as
        a paced uplink sends, rarely queue and barely differ): each exchange's bytes over its
        network time above the session's fastest exchange (`floor`: the propagation delay
        and little else), the 75th percentile over the recent exchanges (the least delayed;
        1e9 for one no slower than the floor)."""
        d = t - self.floor
        rates = np.where(d > 1e-4, b / np.maximum(d, 1e-4), 1e9)
        return float(np.clip(np.percentile(rates, 75), 1e3, 1e9))


@dataclass(frozen=True)
class Shape:
    depth: int
    window: int


def tokens_per_cycle(a: float, window: int) -> float:
    """1 + sum_{i=1..W} a^i: expected tokens decided per verdict cycle."""
    a = min(max(a, 0.0), 0.999)
    return 1.0 + a * (1 - a ** window) / (1 - a)


def cycle_seconds(base_rtt: float, bandwidth: float, shape: Shape, draft_s: float,
                  step_s: float = 0.0, down_per_node: float = DOWN_NODE_GREEDY) -> float:
    """A verdict cycle: the network round trip and a pass, the window's bytes on the link,
    drafting the first chunk (the rest is drafted while waiting), and dead passes in the way.
    down_per_node: a node's Scores bytes (acespec.proto.sizes: greedy or sampled)."""
    chunks = -(-shape.window // shape.depth)
    wire = shape.window * (UP_NODE + down_per_node) + chunks * CHUNK_BYTES
    return (base_rtt + step_s + wire / bandwidth + shape.depth * draft_s
            + 0.5 * (chunks - 1) * step_s)


def choose_shape(a: float, base_rtt: float, bandwidth: float, draft_s: float,
                 current: Shape, max_depth: int = 8, max_window: int = 32,
                 step_s: float = 0.0, down_per_node: float = DOWN_NODE_GREEDY) -> Shape:
    """The (depth, window) with the best modelled tokens/s, or `current` unless the best
    beats it by more than 10 %."""
    def rate(s: Shape) -> float:
        return tokens_per_cycle(a, s.window) / cycle_seconds(base_rtt, bandwidth, s, draft_s,
                                                             step_s, down_per_node)

    grid = [Shape(d, w) for d in (2, 3, 4, 6, 8) if d <= max_depth
            for w in range(d, max_window + 1, d)]
    best = max(grid, key=rate)
    return best if rate(best) > 1.1 * rate(current) else current


@dataclass(frozen=True)
class LinkBudgets:
    """Per-chunk branch budgets from the measured link and device: a share of what the
    link carries in one round trip, and the edge's idle time inside it."""

    share: float = 0.25  # of the link's bytes per round trip given to branches

    def derive(self, base_rtt: float, bandwidth: float, chain_draft_s: float) -> tuple[float, float, float]:
        """(draft_ms, uplink_bytes, downlink_bytes) for one chunk."""
        idle_ms = max(0.0, 1000 * (base_rtt - chain_draft_s))
        link_bytes = self.share * bandwidth * base_rtt
        return idle_ms, link_bytes, link_bytes
