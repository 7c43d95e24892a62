"""What one request does while its verifier cannot be reached (EngineConfig.offline).

* wait  (lossless, the default): the request pauses and resumes with nothing lost or
        repeated when a verifier answers again; callers are told the link is down.
* local: the edge keeps generating with its own drafter. Those tokens are *unverified*:
        callers get them as `Unverified` events, never through `on_tokens`. When a verifier
        answers again the request goes on from the committed (verified) text, and each
        verified token is checked against the unverified span (Runner.emit): equal tokens
        confirm it, the first disagreement drops the rest of it (`Reconciled`). The drafter
        drafts exactly what it would have drafted for the verifier (same sampling, the same
        positional randomness), so a confirmed span costs the verifier one pass per accepted
        run, as any drafts do.

The link counts as down on an error, and on a stall: a session that owes an answer (the edge
wrote since it last heard anything) and has heard nothing for `stall_s`. A stalled session
that had opened is abandoned and a new one dialled (a Wi-Fi-to-cellular handover leaves the
old TCP connection dead for good); one still opening is left to finish (it may be prefilling
a long prompt), but `local` starts answering meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

OFFLINE_MODES = ("wait", "local")
STALL_S = {"wait": 5.0, "local": 0.4}  # default stall threshold per mode, seconds
LOCAL_CHUNK = 4  # tokens per drafter call while offline


@dataclass(frozen=True)
class LinkDown:
    """The verifier stopped answering (an error, or a stall)."""

    reason: str
    committed: int  # verified tokens so far


@dataclass(frozen=True)
class LinkUp:
    """A verifier answers again: a session (re)opened after LinkDown."""

    down_s: float  # how long the link was down


@dataclass(frozen=True)
class Unverified:
    """New unverified tokens (local mode); `span` is the whole unverified span now, after
    the verified text."""

    tokens: tuple[int, ...]
    span: tuple[int, ...]


@dataclass(frozen=True)
class Reconciled:
    """The unverified span is settled: `confirmed` of its tokens were verified as they
    were, the remaining `replaced` were not (verified text goes on from there)."""

    confirmed: int
    replaced: int


LinkEvent = LinkDown | LinkUp | Unverified | Reconciled
OnEvent = Callable[[LinkEvent], None]


class Offline:
    """The outage side of one request (its Runner's `offline`)."""

    def __init__(self, run):
        self.run = run  # acespec.edge.session.runner.Runner
        self.down_since: float | None = None
        self._local: asyncio.Task | None = None

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    @property
    def stall_s(self) -> float:
        cfg = self.run.cfg
        return cfg.stall_s if cfg.stall_s is not None else STALL_S[cfg.offline]

    def down(self, reason: str, stalled: bool = False) -> None:
        """The link is down (idempotent while it stays down); local mode starts answering
        from the drafter. `stalled`: nothing heard for the stall threshold."""
        run = self.run
        if self.down_since is None:
            self.down_since = time.perf_counter()
            run.stats.outages += 1
            # A refusal before any session opened is most likely a wrong address, reported
            # as such soon (engine.Reconnect); anything else is an outage worth a warning.
            loud = run.connected or self.local or stalled
            level = logging.WARNING if loud else logging.INFO
            log.log(level, "verifier unreachable (%s) after %d verified tokens; %s", reason,
                        len(run.out), "answering locally, unverified" if self.local
                        else "waiting for it")
            run.event(LinkDown(reason, len(run.out)))
        if self.local and self._local is None and not run.finished:
            self._local = asyncio.create_task(self._generate())

    @property
    def local(self) -> bool:
        return self.run.cfg.offline == "local" and self.run.drafter is not None

    async def up(self) -> None:
        """A session opened: stop answering locally (the session drafts from here)."""
        await self._stop_local()
        self.heard()

    def heard(self) -> None:
        """The verifier answered: the link is up (again)."""
        if self.down_since is not None:
            down_s = time.perf_counter() - self.down_since
            self.down_since = None
            run = self.run
            run.stats.offline_s += down_s
            log.warning("verifier back after %.1f s down; %d unverified tokens to verify",
                        down_s, len(run.unverified))
            run.event(LinkUp(down_s))

    async def finish_locally(self) -> None:
        """The verifier is gone for good (the reconnect deadline passed): let the local
        answer run to max_tokens or an end token; it stays unverified."""
        if self._local is not None:
            await self._local
            self._local = None
        if self.down_since is not None:
            self.run.stats.offline_s += time.perf_counter() - self.down_since
            self.down_since = None

    async def close(self) -> None:
        await self._stop_local()

    async def _stop_local(self) -> None:
        task, self._local = self._local, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # let a drafter call in flight finish
            if not task.cancelled() and task.exception() is not None:
                log.warning("answering locally failed: %s", task.exception())

    async def _generate(self) -> None:
        """Draft after the verified text and the unverified span until the request's
        token budget or an end token; each chunk goes out as one Unverified event."""
        run = self.run
        while True:
            room = run.cfg.max_tokens - len(run.out) - len(run.unverified)
            if room <= 0 or run.finished or run.local_ended:
                return
            context = run.context + run.unverified
            draft = await asyncio.to_thread(
                run.drafter.draft, context, min(LOCAL_CHUNK, room), run.cfg.serve.sampling,
                run.draft_rng(len(context)), seq=run.seq)
            new = []
            for t in map(int, draft.tokens):
                if t in run.cfg.stop_ids:
                    run.local_ended = True
                    break
                new.append(t)
            if new:
                run.unverified.extend(new)
                run.stats.unverified_tokens += len(new)
                run.event(Unverified(tuple(new), tuple(run.unverified)))
