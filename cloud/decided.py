"""Sessions the verifier decides: greedy and coupled sampling (DESIGN §3, §5).

In these sessions every verdict is a deterministic function of (seed, position, p~), so the
verifier needs no edge to decide: after each pass it walks what it scored, keeps the
accepted drafts, and decides one more token (the correction after a rejection, the bonus
after a fully accepted chain, or - with no draft at all - the next token of plain
autoregressive decoding). It never waits for the link: while the edge learns a verdict and
drafts again, the verifier keeps decoding, and the edge's late drafts are reconciled with
what was decided meanwhile (compared, not scored).

The edge's uplink here is a sequence, not a tree: `Drafts(position, behind, tokens)` says
"my text is your decided tokens up to position - behind, then the drafts I sent before up
to `position`, then `tokens`". The verifier keeps that claimed sequence (`edge`) and the
length of its agreement with the decided one; only drafts beyond the decided end on an
agreeing sequence are scored, so a dead draft never costs a pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from acespec.cloud.errors import InvalidArgument
from acespec.shared.coupled import coupled_target
from acespec.shared.served import ServeParams, sample_served, served


def decide(logits: np.ndarray, params: ServeParams, seed: int, position: int) -> int:
    """The target's token at `position` from the logits [V] of the token before it: greedy
    argmax, coupled Gumbel-max, or (cloud-only sampled decoding) an inverse-CDF draw with the
    uniform of RNG(seed, position). All three are functions of (seed, position, p~)."""
    dist = served(logits, params)
    if params.sampling.greedy:
        return int(dist.ids[0])
    if params.sampling.coupled:
        return coupled_target(dist.ids, dist.units, seed, position)
    return sample_served(dist, np.random.default_rng([seed, position]).random())


@dataclass(frozen=True)
class DecideLimits:
    max_tokens: int  # decide at most this many tokens after the prompt
    stop: frozenset[int] = frozenset()  # a decided stop token ends the session (it is sent)
    context: int = 4096  # positions the model has (max_position_embeddings)
    pass_nodes: int = 64  # most drafts scored in one pass
    vocab: int = 1 << 32  # token ids must be below this


@dataclass
class DecidedCounts:
    """What the session's verifier did, for the edge's stats (sent with the last message)."""

    opened_at: float = field(default_factory=time.perf_counter)
    passes: int = 0
    busy_s: float = 0.0  # seconds in passes for this session
    drafts_received: int = 0
    drafts_scored: int = 0  # drafts fed to a pass
    drafts_reconciled: int = 0  # drafts found equal to tokens decided before they arrived
    continuation: int = 0  # tokens decided with no draft at their position

    def dead_skipped(self) -> int:
        """Drafts never scored nor settled by comparison: behind a rejection, contradicted
        before scoring, or left over when the session ended. (A draft is counted once:
        scored ones are decided or dead after their pass, reconciled ones were decided.)"""
        return self.drafts_received - self.drafts_scored - self.drafts_reconciled


class DecidedSession:
    """The decided text of one session and the edge's claimed continuation of it."""

    def __init__(self, prompt: Sequence[int], params: ServeParams, seed: int,
                 limits: DecideLimits):
        self.params, self.seed, self.limits = params, seed, limits
        self.tokens = list(map(int, prompt))  # [D] prompt + decided; the KV holds all but the last
        self.prompt_len = len(self.tokens)
        self.edge = list(self.tokens)  # the edge's claimed text (decided prefix + its drafts)
        self.agree = len(self.tokens)  # edge[:agree] == tokens[:agree]
        self.done = False
        self.counts = DecidedCounts()
        self._in_pass: list[int] = []

    @property
    def end(self) -> int:
        """D: the next position to decide."""
        return len(self.tokens)

    def pending(self) -> list[int]:
        """Live drafts beyond the decided end (empty when the edge's text disagrees)."""
        return self.edge[self.end:] if self.agree >= self.end else []

    # -- uplink -----------------------------------------------------------------

    def apply_drafts(self, position: int, behind: int, tokens: Sequence[int]) -> None:
        """The edge's text is decided[:position - behind] + its earlier drafts up to
        `position` + tokens. Raises InvalidArgument for a claim that cannot be true."""
        base = position - behind
        if not self.prompt_len <= base <= self.end:
            raise InvalidArgument(f"Drafts builds on {base} decided positions; the session has "
                                  f"{self.prompt_len} prompt + {self.end - self.prompt_len} "
                                  "decided")
        if behind and position > len(self.edge):
            raise InvalidArgument(f"Drafts at position {position} leaves a gap: the edge's "
                                  f"drafts so far end at {len(self.edge)}")
        bad = [t for t in tokens if not 0 <= t < self.limits.vocab]
        if bad:
            raise InvalidArgument(f"Drafts.tokens: token id {bad[0]} is outside the vocabulary "
                                  f"[0, {self.limits.vocab})")
        # In place, O(window) per message: edge[:agree] already equals the decided text, so
        # only [agree, base) is overwritten with it; the edge's drafts from `position` are new.
        if self.agree < base:
            self.edge[self.agree:base] = self.tokens[self.agree:base]
        del self.edge[position:]
        self.edge.extend(map(int, tokens))
        self.agree = max(base, min(self.agree, position))  # edge[:base] is decided text now
        self.counts.drafts_received += len(tokens)
        self._reconcile(unscored_from=position)

    def _reconcile(self, unscored_from: int) -> None:
        """Advance the agreement over positions decided on both sides; drafts from
        `unscored_from` on that match a decided token were settled without a pass. The first
        mismatch stops it: every draft after it is dead (its context is wrong)."""
        stop = min(len(self.edge), self.end)
        while self.agree < stop and self.edge[self.agree] == self.tokens[self.agree]:
            if self.agree >= unscored_from:
                self.counts.drafts_reconciled += 1
            self.agree += 1

    # -- passes -----------------------------------------------------------------

    def plan_pass(self) -> list[int]:
        """Tokens of the next pass: the last decided token (not in the KV yet), then the live
        drafts after it, within the pass and context limits."""
        room = min(self.limits.pass_nodes, self.limits.context - self.end - 1,
                   self.limits.max_tokens - (self.end - self.prompt_len) - 1)
        self._in_pass = self.pending()[:max(0, room)]
        return [self.tokens[-1]] + self._in_pass

    def finish_prefill(self, row: np.ndarray, seconds: float) -> tuple[int, list[int]]:
        """Decide the first token from the prompt's last logits row [V] (the prefill pass):
        the KV then holds the whole prompt, all but the last decided token."""
        self._in_pass = []
        return self.finish_pass(row[None, :], seconds)

    def finish_pass(self, rows: np.ndarray, seconds: float) -> tuple[int, list[int]]:
        """Decide from the pass's logits rows [1 + n, V]: returns (position of the first
        decided token, decided tokens: accepted drafts then one more). The KV keeps the
        slots of all but the last decided token."""
        drafts, start = self._in_pass, self.end
        new: list[int] = []
        for i in range(len(drafts) + 1):
            y = decide(rows[i], self.params, self.seed, start + i)
            new.append(y)
            if i == len(drafts):
                self.counts.continuation += 1
            if i == len(drafts) or drafts[i] != y or y in self.limits.stop:
                break
        self.counts.passes += 1
        self.counts.busy_s += seconds
        self.counts.drafts_scored += len(drafts)
        new = self._commit(new)
        # Drafts that arrived during the pass (or beyond its limit) meet the decided tokens.
        self._reconcile(unscored_from=start + len(drafts))
        return start, new

    def _commit(self, new: list[int]) -> list[int]:
        """Append decided tokens, ending the session at a stop token, max_tokens or the
        context's end."""
        left = min(self.limits.max_tokens - (self.end - self.prompt_len),
                   self.limits.context - self.end)
        new = new[:left]
        for i, t in enumerate(new):
            if t in self.limits.stop:
                new = new[:i + 1]
                break
        self.tokens += new
        if (self.end - self.prompt_len >= self.limits.max_tokens or
                (new and new[-1] in self.limits.stop) or self.end >= self.limits.context):
            self.done = True
        return new

    def kept_slots(self) -> int:
        """KV slots to keep after a pass: every decided token but the last."""
        return self.end - 1
