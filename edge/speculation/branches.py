"""Guessed branches of the speculation tree, pre-built and pre-scored (docs/design.md §6).

While a chunk of drafts is in flight, the edge guesses, for draft positions j, the token c
that would be recovered if the draft at j were rejected (from q's ranks), drafts a few
tokens after c on a forked drafter sequence, and uploads [c, drafts...] as a branch under
j's parent in the same Extend, so the cloud scores them in the same pass. If the walk
rejects at j and the exactly drawn recovered token equals c, it walks into the branch: no
round trip lost (a hit). Guessed tokens are never tested with p/q, so exactness holds.

Which branches to build is a Lagrangian allocation (acespec.edge.speculation.allocator) of value
P(first rejection at j) * P(c | rejection at j) * saved time, against budgets in edge KV
bytes, draft time, uplink bytes, downlink bytes and cloud nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from acespec.edge.speculation.allocator import BUDGETS, Candidate, allocate
from acespec.edge.speculation.calibration import AcceptanceModel, RecoveryModel
from acespec.proto.sizes import DOWN_NODE_GREEDY, UP_BRANCH_NODE, UP_NODE


@dataclass(frozen=True)
class CacheConfig:
    """Budgets per chunk. draft_ms / uplink_bytes / downlink_bytes of None are derived from
    the measured link and device (acespec.edge.speculation.adaptive.LinkBudgets); a number fixes them."""

    guesses: int = 2  # recovery tokens considered per draft position
    branch_depth: int = 4  # most drafts below a guessed token
    kv_bytes: float = 64e6  # edge memory for branch KV
    draft_ms: float | None = None  # edge draft time per chunk spent on branches
    uplink_bytes: float | None = None  # per chunk
    downlink_bytes: float | None = None  # per chunk
    cloud_nodes: float = 8.0  # extra nodes per chunk
    node_s: float | None = None  # what one branch node costs in time; None: from the link

    def budgets(self, derived: tuple[float, float, float] = (6.0, 24.0, 96.0)) -> np.ndarray:
        """[K] in the order of allocator.BUDGETS; `derived` fills the unset ones."""
        mine = (self.draft_ms, self.uplink_bytes, self.downlink_bytes)
        d, u, w = (m if m is not None else x for m, x in zip(mine, derived))
        return np.array([self.kv_bytes, d, u, w, self.cloud_nodes])


@dataclass(frozen=True)
class Branch:
    j: int  # index in the chunk of the draft it hedges
    token: int  # the guessed recovered token
    depth: int  # drafts to build below it


@dataclass
class CacheStats:
    rejections: int = 0
    hits: int = 0
    branches_uploaded: int = 0
    branch_nodes: int = 0
    hits_restarted: int = 0  # hits after which the verifier had nothing to continue with
    drafts_judged: int = 0  # decided sessions: positions decided where a line draft was sent
    drafts_in_time: int = 0  # ... whose draft the verifier held when it decided them

    @property
    def in_time_rate(self) -> float | None:
        return self.drafts_in_time / self.drafts_judged if self.drafts_judged else None

    @property
    def hit_rate(self) -> float:
        return self.hits / self.rejections if self.rejections else 0.0


def guesses(r: np.ndarray, x: int, n: int) -> list[int]:
    """The drafter's n most likely tokens other than the draft x, from r [V] (ties: lower
    id first). A partial selection: no sort of the vocabulary."""
    k = min(n + 1, len(r))
    top = np.argpartition(-r, k - 1)[:k] if k < len(r) else np.arange(len(r))
    top = top[np.lexsort((top, -r[top]))]
    return [int(t) for t in top if t != x][:n]


@dataclass(frozen=True)
class NodeCosts:
    """What one speculated node costs in each budget (order of allocator.BUDGETS, less
    cloud_nodes: one each): a branch node here, a node of the speculation tree in
    acespec.edge.speculation.grow_tree. Wire bytes from acespec.proto.sizes."""

    kv_per_token: float = 4096.0  # drafter KV bytes per token
    draft_ms: float = 1.0  # drafter time per drafted token
    up_per_node: float = UP_NODE  # a chain node; a branch's first node costs UP_BRANCH_NODE more
    down_per_node: float = DOWN_NODE_GREEDY  # its Scores (DOWN_NODE_SAMPLED when sampled)


def plan(qs: np.ndarray, drafts: np.ndarray, acc: AcceptanceModel, cfg: CacheConfig,
         token_s: float, node_s: float, costs: NodeCosts, budgets: np.ndarray,
         ranks: np.ndarray | None = None, rec: RecoveryModel | None = None) -> list[Branch]:
    """Branches worth building for one chunk: drafts [n] drawn from qs [n, V]; guesses are
    ranked by `ranks` [n, V] (the drafter's plain softmax) when given, else by q; their
    probabilities come from `rec` (calibrated on revealed recoveries) when given.

    A hit on a branch [c, d1..dk] decides c's successor and each accepted d_i without a new
    round trip: the expected saving of node (j, c, i) is P(first rejection at j) *
    P(c | rejection) * a^i * token_s (token_s: the current time per generated token), less
    node_s, what one more node adds to the cycle (its bytes on the link, its share of the
    verifier's pass): only branches that pay for themselves are candidates."""
    cands, reach = [], 1.0
    ranks = qs if ranks is None else ranks
    k = costs
    for j, (r, x) in enumerate(zip(ranks, drafts)):
        a = acc.p(float(r[x]))  # confidence: the drafter's own probability of its draft
        rej = reach * (1 - a)
        rest = max(1e-9, 1 - float(r[x]))
        for rank, c in enumerate(guesses(r, int(x), cfg.guesses)):
            p_c = float(r[c]) / rest
            p_c = rec.p(rank, p_c) if rec is not None else p_c
            if p_c <= 0:
                continue
            root = (j, c, 0)
            cands.append(Candidate(root, None, rej * p_c * token_s - node_s,
                                   (k.kv_per_token, 0.0, k.up_per_node + UP_BRANCH_NODE,
                                    k.down_per_node, 1.0)))
            for d in range(1, cfg.branch_depth + 1):
                cands.append(Candidate((j, c, d), (j, c, d - 1),
                                       rej * p_c * a ** d * token_s - node_s,
                                       (k.kv_per_token, k.draft_ms, k.up_per_node,
                                        k.down_per_node, 1.0)))
        reach *= a
    if not cands:
        return []
    chosen = allocate(cands, budgets).selected
    depth: dict[tuple[int, int], int] = {}
    for j, c, k in chosen:
        depth[(j, c)] = max(depth.get((j, c), 0), k)
    return [Branch(j, c, d) for (j, c), d in sorted(depth.items())]


__all__ = ["AcceptanceModel", "Branch", "BUDGETS", "CacheConfig", "CacheStats",
           "NodeCosts", "RecoveryModel", "guesses", "plan"]
