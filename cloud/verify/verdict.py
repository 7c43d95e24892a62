"""Verdicts of the sessions the verifier decides (docs/design.md §3, §5): the rule that
decides the token at a position from the target's logits, and the walk that applies it down
one scored pass. A verdict is a deterministic function of (seed, position, p~), so the
verifier needs no edge to decide. Pure: no session state, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from acespec.shared.coupled import coupled_target
from acespec.shared.grammar import Cursor
from acespec.shared.served import ServeParams, sample_served, served
from acespec.shared.shaping import shape

FIRST = -1  # a fed node's parent in the pass: its first input (the decided text's last token)


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
class Walk:
    """What one pass decided: the walked nodes' tokens, then one more (the recovered token
    after a rejection, the bonus after an accepted leaf, or a continuation)."""

    tokens: list[int]  # [k + 1] decided tokens
    path: list[int]  # [k] pass indices (among the fed nodes) of the walked nodes
    hits: int  # walks into a guess: a child sent after the first of its parent
    restarted: bool  # it ended on the guess it entered last, which had nothing below it in
    # the pass: decoding went on alone

    def rows(self) -> list[int]:
        """The logits row [k + 1] that decided each token: the first input's, then each
        walked node's."""
        return [0] + [1 + i for i in self.path]


def walk(parents: Sequence[int], tokens: Sequence[int], rows: np.ndarray,
         verdict: Callable[[np.ndarray, list[int]], int], stop: frozenset[int]) -> Walk:
    """Walk one scored pass from the decided end. parents: [n] each fed node's parent, a
    pass index or FIRST, parents before children; tokens: [n]; rows: [1 + n, V] logits, row
    0 the first input's and row 1 + i fed node i's. verdict(row, decided so far in this walk)
    is the session's token there. The walk enters the child holding that token (the first
    sent, among equal ones) and ends at a token no child holds, or at a stop token."""
    kids: dict[int, dict[int, int]] = {}  # parent index -> token -> child index
    for i, (p, t) in enumerate(zip(parents, tokens)):
        kids.setdefault(p, {}).setdefault(t, i)
    new: list[int] = []
    path: list[int] = []
    at, hits, hit = FIRST, 0, None  # hit: the guess entered last
    while True:
        y = verdict(rows[at + 1], new)
        new.append(y)
        nxt = kids.get(at, {}).get(y)
        if nxt is None or y in stop:
            return Walk(new, path, hits, hit is not None and at == hit and at not in kids)
        if nxt != next(iter(kids[at].values())):  # not the first child: a guess
            hits, hit = hits + 1, nxt
        path.append(nxt)
        at = nxt
