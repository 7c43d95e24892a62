"""The live one-line status `acespec edge generate` shows on a terminal."""

from __future__ import annotations

import sys
import time


class LiveStatus:
    """A one-line live status on stderr (only on a terminal)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.t0, self.shown = time.perf_counter(), False

    def show(self, stats) -> None:
        if not self.enabled:
            return
        n = max(stats.tokens, 1)
        rate = stats.tokens / max(time.perf_counter() - self.t0, 1e-9)
        al = stats.tokens / stats.rounds if stats.rounds else 0.0
        rtt = f"{1000 * sorted(stats.round_trips)[len(stats.round_trips) // 2]:.0f} ms" \
            if stats.round_trips else "-"
        sys.stderr.write(f"\r\033[2K  … {stats.tokens} tok | {rate:.1f} tok/s | AL {al:.2f} | "
                         f"up {stats.wire_bytes_up / n:.1f} B/tok down "
                         f"{stats.wire_bytes_down / n:.1f} B/tok | RTT {rtt}")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[2K")
            self.shown = False
