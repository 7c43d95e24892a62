"""Exact verification of a scored draft tree against sparse served distributions
(docs/design.md §5).

At a node n whose next-token distribution p~ has arrived, the next token t is decided:
  * n has a drafted child x (drawn from q): accept with prob min(1, p~(x)/q(x)); on rejection
    t is the *recovered* token, drawn from (p~ - q)+ by the envelope scheme below;
  * n has no drafted child: t is the *bonus* token, drawn from p~.
Then, if n has a scored child with token t (the drafted child, or a branch the speculation tree
guessed), the walk moves into it and continues; guessed branch tokens are never tested with
p/q, so a wrong guess costs bytes, never exactness. Greedy: t = argmax p~.

Envelope scheme for the recovered token with a sparse p~: g = (p~ - q)+ on the sent entries
(mass A) plus p~ on the tail (mass T); draw from g/(A+T). A draw from the sent entries is
the answer; a tail draw takes the node's next pre-drawn sample z and keeps it with
probability (1 - q(z)/p~(z))+, else the draw repeats. When the pre-drawn samples run out the
walk stops with `need_tail`; the caller fetches more (MoreTail) and walks again. Randomness
comes from rng_at(position), so walking again replays every earlier decision exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from acespec.shared.served import UNITS, NodeScore


class NeedTail(Exception):
    """More pre-drawn tail samples of a node are needed (send MoreTail)."""

    def __init__(self, node_id: int):
        super().__init__(f"node {node_id} ran out of tail samples")
        self.node_id = node_id


@dataclass
class Node:
    """A node of the edge's view of the session trie."""

    node_id: int
    token: int
    position: int  # index of this token in the whole sequence
    q: np.ndarray | None = None  # [V] the distribution this token was drafted from (None: not drafted)
    score: NodeScore | None = None  # p~ of the next token, once the downlink delivered it
    tails: list[tuple[int, int]] = field(default_factory=list)  # (token, units) pre-drawn tail samples
    children: dict[int, Node] = field(default_factory=dict)  # token -> child
    drafted: Node | None = None  # the child drawn from q (at most one)


@dataclass
class Walk:
    tokens: list[int]  # decided tokens, in order (accepted drafts, walked branch tokens, final)
    end: Node  # deepest node reached
    waiting: bool  # True: `end` awaits its scores; False: tokens[-1] has no node yet
    accepted: int = 0  # drafted tokens accepted
    branch_hits: int = 0  # recovered/bonus tokens that matched a pre-built branch


def walk(root: Node, greedy: bool, rng_at: Callable[[int], np.random.Generator],
         bonus_at_leaves: bool = True) -> Walk:
    """Decide tokens below `root` as far as the scores allow. Raises NeedTail.

    Sampled decisions must not depend on timing or on where a session was (re)opened, so
    a bonus is drawn only below the root (a freshly opened root drafts first), and not at
    all with bonus_at_leaves=False (a pipeline about to draft there): then each position is
    decided by testing the draft drawn for that position, and the output for a seed is the
    same however the work was chunked or resumed."""
    n, out = root, Walk([], root, waiting=root.score is None)
    while n.score is not None:
        bonus_ok = bonus_at_leaves and n is not root
        if not (greedy or bonus_ok or n.drafted is not None):
            break
        try:
            t = _decide(n, greedy, rng_at(n.position + 1), out)
        except _NotYet:  # the draft's own score (its self_p) has not arrived
            break
        out.tokens.append(t)
        child = n.children.get(t)
        if child is None:
            out.end, out.waiting = n, False
            return out
        if child is not n.drafted:
            out.branch_hits += 1
        n = child
    out.end, out.waiting = n, True
    return out


def _decide(n: Node, greedy: bool, rng: np.random.Generator, out: Walk) -> int:
    score = n.score
    if greedy:
        t = score.greedy_token
        if n.drafted is not None and n.drafted.token == t:
            out.accepted += 1
        return t
    x = n.drafted
    if x is None:
        return bonus(n, rng)
    p_x = _self_p(n, x)
    if rng.random() * x.q[x.token] < p_x:  # accept with prob min(1, p/q), no division
        out.accepted += 1
        return x.token
    return recovered(n, x.q, rng)


def _self_p(n: Node, x: Node) -> float:
    """p~(x | n): the child's self_p when it is scored, else read from n's sparse p~."""
    if x.score is not None:
        return x.score.self_units / UNITS
    hit = np.nonzero(n.score.ids == x.token)[0]
    if len(hit):
        return n.score.units[hit[0]] / UNITS
    for z, u in n.tails:
        if z == x.token:
            return u / UNITS
    raise _NotYet


class _NotYet(Exception):
    """p~(x | n) is not known until x itself is scored."""


def recovered(n: Node, q: np.ndarray, rng: np.random.Generator) -> int:
    """A draw from norm((p~ - q)+) at node n, exact with a sparse p~ (envelope scheme)."""
    s = n.score
    g = np.maximum(s.units / UNITS - q[s.ids], 0.0)  # [k] residual on the sent entries
    a, tail = g.sum(), s.tail_units / UNITS
    used = 0
    while True:
        if a + tail <= 0:  # p~ <= q everywhere: rejection had probability 0; stay exact-safe
            return bonus(n, rng)
        if rng.random() * (a + tail) < a:
            return int(s.ids[_pick(g / a, rng)])
        if used >= len(n.tails):
            raise NeedTail(n.node_id)
        z, pz = n.tails[used]
        used += 1
        if rng.random() * pz < pz - q[z] * UNITS:  # keep w.p. (1 - q(z)/p~(z))+
            return int(z)


def bonus(n: Node, rng: np.random.Generator) -> int:
    """A draw from p~ at node n: sent entries by their units, else the next tail sample."""
    s = n.score
    sent = int(s.units.sum())
    if rng.random() * UNITS < sent:
        return int(s.ids[_pick(s.units / sent, rng)])
    if not n.tails:
        raise NeedTail(n.node_id)
    return int(n.tails[0][0])


def _pick(probs: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))
