"""The link emulator's clock (docs/design.md §7): a chunk carries the time it reaches a point
of the link, and an outage schedule says when the link carries nothing. Every stage
(acespec.sim.stages, acespec.sim.trace) reads and writes these."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    size: int  # bytes
    t: float  # seconds: when the chunk is at the current point of the link


class OutageSchedule:
    """When a link is down: windows [start_s, end_s) on the link's clock (seconds since the
    link started). Shared and mutable: every stage built with it sees a window added later."""

    def __init__(self, windows: Iterable[tuple[float, float]] = ()):
        # A list passed in is kept, not copied: whoever holds it can add windows.
        self.windows: list[tuple[float, float]] = (
            windows if isinstance(windows, list) else list(windows))  # [(start_s, end_s)]
        for s, e in self.windows:
            if not 0 <= s < e:
                raise ValueError(f"an outage window needs 0 <= start < end, got ({s}, {e})")

    @classmethod
    def of(cls, outages: Iterable[tuple[float, float]]) -> OutageSchedule:
        """From (start_s, duration_s) pairs, as LinkSpec.outages holds them."""
        sched = cls()
        for start, duration in outages:
            sched.add(start, duration)
        return sched

    def add(self, start_s: float, duration_s: float) -> None:
        """The link is down for `duration_s` seconds from `start_s`."""
        if start_s < 0 or duration_s <= 0:
            raise ValueError(f"an outage needs start >= 0 and duration > 0, got {start_s}, "
                             f"{duration_s}")
        self.windows.append((start_s, start_s + duration_s))

    def back_at(self, t: float) -> float:
        """The first time >= t (seconds) when the link is up: t itself if it is up then."""
        moved = True
        while moved:  # windows may overlap or abut
            moved = False
            for s, e in self.windows:
                if s <= t < e:
                    t, moved = e, True
        return t

    def next_start(self, t: float) -> float:
        """The start of the first window that begins after t (inf: none)."""
        return min((s for s, _ in self.windows if s > t), default=float("inf"))

    def transmit(self, start: float, seconds: float) -> float:
        """When sending that takes `seconds` of link time, begun at `start`, is done: the
        link sends nothing during a window."""
        t, left = self.back_at(start), seconds
        while t + left > (s := self.next_start(t)):
            left -= s - t
            t = self.back_at(s)
        return t + left
