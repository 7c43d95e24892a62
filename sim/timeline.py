"""How the bench meets its links and its user: one connection per link, or a fresh one per
run for a link that changes in time (a trace, outages), started at the run's point of the
link's cycle; and when new tokens appear on the user's screen (Screen)."""

from __future__ import annotations

import contextlib
import time

from acespec.edge.client import channel
from acespec.edge.shown import SpanMirror
from acespec.sim.proxy import ProxyThread
from acespec.sim.stages import LinkSpec
from acespec.sim.trace import read_trace


@contextlib.asynccontextmanager
async def links(seed: int, host: str, port: int, spec: LinkSpec):
    """link_for(phase) -> (proxy, channel) for one run. A fixed link is one long-lived
    connection for every run, as an edge keeps it (per-token bytes then measure steady
    state, not a TCP/HTTP-2 handshake per request). A link that changes in time (a trace,
    outages) is a fresh one per run, its clock started at `phase` (0..1) of the link's
    cycle: run i of n starts i/n into it, so every mode meets the same conditions on the
    same prompt and the prompts together cover the whole cycle."""
    async def open_(clock_s: float):
        # The link runs on its own loop: the edge's drafting must not hold its packets back.
        proxy = ProxyThread(host, port, spec=spec, seed=seed, clock_s=clock_s)
        return proxy, channel(f"127.0.0.1:{await proxy.start()}")

    async def close(proxy, ch) -> None:
        await ch.close()
        await proxy.stop()

    cycle = link_cycle_s(spec)
    if cycle is None:
        shared = await open_(0.0)

        @contextlib.asynccontextmanager
        async def link_for(phase: float):
            yield shared
    else:
        shared = None

        @contextlib.asynccontextmanager
        async def link_for(phase: float):
            proxy, ch = await open_(phase * cycle)
            try:
                yield proxy, ch
            finally:
                await close(proxy, ch)
    try:
        yield link_for
    finally:
        if shared:
            await close(*shared)


def link_cycle_s(spec: LinkSpec) -> float | None:
    """Seconds of a link that changes in time: its trace's length, else up to 5 s after its
    last outage; None for a fixed link."""
    if spec.trace:
        return float(read_trace(spec.trace).times[-1])
    if spec.outages:
        return max(start + length for start, length in spec.outages) + 5.0
    return None


class Screen:
    """When new tokens appear on the user's screen: a verified token that no unverified one
    showed already, and unverified tokens (local offline mode); a confirmation shows nothing
    new. The longest gap counts only while the screen is short of the whole answer."""

    def __init__(self, max_tokens: int):
        self.max_tokens, self.mirror = max_tokens, SpanMirror()
        self.n_verified = 0
        self.stamps: list[float] = []  # perf_counter of each appearance
        self.shown: list[int] = []  # tokens on screen after each appearance

    def verified(self, ids: list[int], stats=None) -> None:
        for t in ids:
            new = not (self.mirror.span and self.mirror.span[0] == t)
            self.mirror.verified([t])
            self.n_verified += 1
            if new:
                self._stamp(self.n_verified + len(self.mirror.span))

    def event(self, e) -> None:
        self.mirror.event(e)
        if getattr(e, "tokens", None):  # Unverified
            self._stamp(self.n_verified + len(self.mirror.span))

    def _stamp(self, shown: int) -> None:
        self.stamps.append(time.perf_counter())
        self.shown.append(shown)

    def longest_gap(self) -> float | None:
        """Seconds: the longest wait for the next appearance, from the first one on."""
        waits = [b - a for a, b, n in zip(self.stamps, self.stamps[1:], self.shown)
                 if n < self.max_tokens]
        return round(max(waits), 3) if waits else None
