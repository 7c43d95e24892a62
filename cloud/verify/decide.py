"""What decides a token of a session the verifier decides, and that session's limits and
account (docs/design.md §3, §5): a verdict is a deterministic function of (seed, position,
p~), so the verifier needs no edge to decide."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from acespec.shared.coupled import coupled_target
from acespec.shared.grammar import Cursor
from acespec.shared.served import ServeParams, sample_served, served
from acespec.shared.shaping import shape


def decide(logits: np.ndarray, params: ServeParams, seed: int, position: int,
           text: Sequence[int] = (), grammar: Cursor | None = None) -> int:
    """The target's token at `position` from the logits [V] of the token before it: greedy
    argmax, coupled Gumbel-max, or (cloud-only sampled decoding) an inverse-CDF draw with the
    uniform of RNG(seed, position). All three are functions of (seed, position, p~). With
    penalties or a grammar, p~ is the penalised, constrained target's after `text` (every
    token before `position`)."""
    dist = served(shape(logits, text, params.sampling, grammar), params)
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
    max_pending: int = 2048  # most pending Drafts nodes (2x the edge's largest window)
    vocab: int = 1 << 32  # token ids must be below this
    propose: int = 0  # a pass no draft covers scores up to this many of the verifier's own
    # proposals (prompt lookup over the session's text; 0: none)
    propose_min_n: int = 1  # shortest n-gram a proposal must follow


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
    hits: int = 0  # walks into a later-sent sibling (a guessed recovery branch), not the first
    hits_restarted: int = 0  # ... that held no draft below the guess: decoding went on alone
    lone_passes: int = 0  # passes no edge draft covered (the decided end had none)
    lone_tokens: int = 0  # tokens those passes decided
    proposed: int = 0  # the verifier's own proposals scored (in lone passes)
    proposed_accepted: int = 0  # ... that the walk took
    gap_s: float = 0.0  # seconds the gap drafter spent drafting this session's proposals

    def dead_skipped(self) -> int:
        """Drafts never scored nor settled by comparison: behind a rejection, contradicted
        before scoring, or left over when the session ended. (A draft is counted once:
        scored ones are decided or dead after their pass, reconciled ones were decided.)"""
        return self.drafts_received - self.drafts_scored - self.drafts_reconciled
