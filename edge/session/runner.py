"""What every mode of one request shares, across reconnects: the committed text and its
emission (stop ids, max_tokens, the caller's callback), the stats and live byte counts,
drafter calls off the event loop, the positional RNGs, the models that learn from verdicts,
and the link estimate. A driver (one per wire protocol, acespec.edge.session.driver) runs
one connection attempt through this runner's public surface only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from acespec.edge.client import CloudSession, VerifierTooOld
from acespec.edge.session.config import EngineConfig, Stats
from acespec.edge.session.offline import LinkEvent, Offline, OnEvent, Reconciled
from acespec.edge.speculation.adaptive import LinkEstimate, Shape
from acespec.edge.speculation.calibration import AcceptanceModel, RecoveryModel
from acespec.shared.logprobs import TokenLogprob
from acespec.shared.sampling import PositionalRng

# on_tokens(new tokens, running stats) -> True when the caller wants no more (a stop string)
OnTokens = Callable[[list[int], Stats], "bool | None"]


class Runner:
    """State of one request across reconnects (EdgeEngine.generate makes one per request)."""

    def __init__(self, drafter, prompt: list[int], cfg: EngineConfig,
                 on_tokens: OnTokens | None, seq: int, branch_seqs: list[int],
                 on_event: OnEvent | None = None):
        self.drafter, self.prompt, self.cfg, self.on_tokens = drafter, prompt, cfg, on_tokens
        self.on_event = on_event
        self.seq, self.branch_seqs = seq, branch_seqs  # drafter sequences this request owns
        self.acc = AcceptanceModel()  # P(accept | drafter confidence), learnt from verdicts
        self.rec = RecoveryModel(cfg.cache.guesses)  # P(recovered token = guess k)
        self.link = LinkEstimate()
        self.shape = Shape(cfg.depth, cfg.window)  # follows the link when cfg.adaptive
        self.alpha = 0.7  # running per-position acceptance (for the shape model)
        self.draft_s = 1e-3  # running drafter seconds per token
        self.out: list[int] = []  # the committed text (after the prompt)
        self.unverified: list[int] = []  # local mode: drafted while offline, after `out`
        self.local_ended = False  # the unverified span ends in an end token
        self.offline = Offline(self)
        self.stats = Stats()
        self._confirmed = 0  # unverified tokens confirmed since the span was last settled
        self._logprobs: dict[int, TokenLogprob] = {}  # position -> the target's, until emitted
        self.t0 = time.perf_counter()
        self._last_s = 0.0  # when the last token was emitted (seconds from t0)
        self.finished = False
        self.connected = False  # a verifier answered at least once (resume, not fail fast)
        self._sess: CloudSession | None = None  # the live session (for live byte counts)
        self._base_bytes = (0, 0, 0)

    @property
    def context(self) -> list[int]:
        """Prompt + committed text: what a new session opens with."""
        return self.prompt + self.out

    @property
    def committed_end(self) -> int:
        """Position just after the committed text."""
        return len(self.prompt) + len(self.out)

    # -- live byte counts -----------------------------------------------------------

    def attach(self, sess: CloudSession) -> None:
        """Count this session's wire bytes on top of the earlier attempts'."""
        self._sess = sess
        self._base_bytes = (self.stats.wire_bytes_up, self.stats.wire_bytes_down,
                            self.stats.messages_up)

    def detach(self) -> None:
        self._sync_bytes()
        self._sess = None

    def _sync_bytes(self) -> None:
        if self._sess is not None:
            self.stats.wire_bytes_up = self._base_bytes[0] + self._sess.bytes_up
            self.stats.wire_bytes_down = self._base_bytes[1] + self._sess.bytes_down
            self.stats.messages_up = self._base_bytes[2] + self._sess.messages_up

    # -- committed text -------------------------------------------------------------

    def emit(self, tokens: list[int]) -> None:
        """Append decided tokens, honouring stop ids and max_tokens, and check each against
        the unverified span, if any (its Reconciled event follows the token's on_tokens)."""
        for t in tokens:
            if self.finished:
                return
            if self.offline.is_down:  # a verifier answered (ar mode has no open to see)
                self.offline.heard()
            settled = self._settle(t)
            if t in self.cfg.stop_ids:
                self.finished = True
                self.announce(settled or self.settle_all())
                return
            self._take_logprob()
            self.out.append(t)
            self.stats.tokens += 1
            now = time.perf_counter() - self.t0
            if self.stats.first_token_s is None:
                self.stats.first_token_s = now
            else:  # a stall the user sees: the longest wait between two tokens
                self.stats.longest_gap_s = max(self.stats.longest_gap_s, now - self._last_s)
            self._last_s = now
            if self.on_tokens:
                self._sync_bytes()
                if self.on_tokens([t], self.stats):  # the caller wants no more (a stop string)
                    self.finished = True
            self.announce(settled)
            if len(self.out) >= self.cfg.max_tokens:
                self.finished = True

    def expect_logprobs(self, position: int, entries: list[TokenLogprob]) -> None:
        """The target's logprobs of the tokens the verifier decided at position, position+1,
        ...: each joins Stats.logprobs as its token is committed."""
        for i, e in enumerate(entries):
            self._logprobs[position + i] = e

    def _take_logprob(self) -> None:
        if self.cfg.logprobs is None:
            return
        entry = self._logprobs.pop(self.committed_end, None)
        if entry is None:
            raise VerifierTooOld(f"the verifier sent no logprobs for position "
                                 f"{self.committed_end} (it is older than this edge): "
                                 "upgrade it, or ask without logprobs")
        self.stats.logprobs.append(entry)

    def _settle(self, t: int) -> Reconciled | None:
        """Verified token t against the head of the unverified span: equal, it is
        confirmed; else the span is dropped from there. The span's end, if settled."""
        if not self.unverified and not self.local_ended:
            return None
        if self.unverified and self.unverified[0] == t:
            self.unverified.pop(0)
            self.stats.unverified_confirmed += 1
            self._confirmed += 1
            return None if self.unverified or self.local_ended else self._reconciled(0)
        return self._reconciled(len(self.unverified))

    def settle_all(self) -> Reconciled | None:
        """The verified text ended (a stop, max_tokens): what is left of the span is not
        confirmed. Returns the event to announce, if any."""
        if self.unverified or self.local_ended:
            return self._reconciled(len(self.unverified))
        return None

    def _reconciled(self, replaced: int) -> Reconciled:
        self.stats.unverified_replaced += replaced
        self.unverified.clear()
        self.local_ended = False
        confirmed, self._confirmed = self._confirmed, 0
        return Reconciled(confirmed, replaced)

    def announce(self, e: LinkEvent | None) -> None:
        if e is not None:
            self.event(e)

    def event(self, e: LinkEvent) -> None:
        if self.on_event:
            self._sync_bytes()
            self.on_event(e)

    # -- randomness -----------------------------------------------------------------

    def rng_at(self, purpose: int) -> Callable[[int], np.random.Generator]:
        """position -> the generator of that position (a function of seed, position, purpose)."""
        seed = self.cfg.seed
        return lambda position: np.random.default_rng([seed, position, purpose])

    def draft_rng(self, position: int) -> PositionalRng:
        """Uniforms for drafts at position, position+1, ...: keyed by position, not chunk."""
        return PositionalRng(self.cfg.seed, position, purpose=0)

    # -- drafting -------------------------------------------------------------------

    async def draft(self, context: list[int], n: int, seq: int):
        """Draft n tokens after context in drafter sequence seq, in a worker thread: the
        event loop meanwhile reads the downlink, writes the uplink and serves HTTP (a slow
        edge drafts for tens of ms per call). Timed into draft_s."""
        t0 = time.perf_counter()
        draft = await asyncio.to_thread(self.drafter.draft, context, n,
                                        self.cfg.serve.sampling, self.draft_rng(len(context)),
                                        seq=seq)
        self._count_drafts(t0, len(draft))
        return draft

    async def draft_many(self, contexts: list[list[int]], seqs: list[int]) -> list:
        """One draft token after each context, each in its own sequence: one batched decode
        in a worker thread (as `draft`) where the drafter batches, else one call each."""
        if not hasattr(self.drafter, "draft_many"):
            return [await self.draft(c, 1, s) for c, s in zip(contexts, seqs)]
        t0 = time.perf_counter()
        drafts = await asyncio.to_thread(self.drafter.draft_many, contexts,
                                         self.cfg.serve.sampling,
                                         [self.draft_rng(len(c)) for c in contexts], seqs)
        self._count_drafts(t0, len(contexts))
        return drafts

    def _count_drafts(self, t0: float, n: int) -> None:
        if n:
            self.draft_s += 0.2 * ((time.perf_counter() - t0) / n - self.draft_s)
        self.stats.drafted += n

    def note_link(self, **extra) -> None:
        """The link estimate in force, into the stats (and any figures derived from it)."""
        link = self.link
        self.stats.link = {"bytes_per_s": round(link.bandwidth()),
                           "base_rtt_ms": round(1000 * link.base_rtt(), 1),
                           "step_ms": round(1000 * link.step(), 1), **extra}

    def learn_acceptance(self, accepted: bool) -> None:
        """One verdict on a draft: the running acceptance the shape model uses."""
        self.alpha += 0.05 * (accepted - self.alpha)
