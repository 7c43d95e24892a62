"""The probabilistic state cache (DESIGN §6): recovery branches pre-built and pre-scored.

While a chunk of drafts is in flight, the edge guesses, for draft positions j, the token c
that would be recovered if the draft at j were rejected (from q's ranks), drafts a few
tokens after c on a forked drafter sequence, and uploads [c, drafts...] as a branch under
j's parent in the same Extend, so the cloud scores them in the same pass. If the walk
rejects at j and the exactly drawn recovered token equals c, it walks into the branch: no
round trip lost (a hit). Guessed tokens are never tested with p/q, so exactness holds.

Which branches to build is a Lagrangian allocation (acespec.edge.allocator) of value
P(first rejection at j) * P(c | rejection at j) * saved time, against budgets in edge KV
bytes, draft time, uplink bytes, downlink bytes and cloud nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from acespec.edge.allocator import BUDGETS, Candidate, allocate


@dataclass(frozen=True)
class CacheConfig:
    guesses: int = 2  # recovery tokens considered per draft position
    branch_depth: int = 2  # drafts below a guessed token
    kv_bytes: float = 64e6  # edge memory for branch KV
    draft_ms: float = 6.0  # edge draft time per chunk spent on branches
    uplink_bytes: float = 24.0  # per chunk
    downlink_bytes: float = 96.0  # per chunk
    cloud_nodes: float = 8.0  # extra nodes per chunk

    def budgets(self) -> np.ndarray:  # [K] in the order of allocator.BUDGETS
        return np.array([self.kv_bytes, self.draft_ms, self.uplink_bytes,
                         self.downlink_bytes, self.cloud_nodes])


@dataclass
class AcceptanceModel:
    """P(accept) of a draft from its confidence q(x), calibrated online: Beta(2, 1) prior per
    bin of q(x), updated with every verdict the walk reveals."""

    bins: int = 10
    accepted: np.ndarray = field(default_factory=lambda: np.full(10, 2.0))
    total: np.ndarray = field(default_factory=lambda: np.full(10, 3.0))

    def _bin(self, qx: float) -> int:
        return min(self.bins - 1, int(qx * self.bins))

    def p(self, qx: float) -> float:
        b = self._bin(qx)
        return float(self.accepted[b] / self.total[b])

    def update(self, qx: float, accepted: bool) -> None:
        b = self._bin(qx)
        self.total[b] += 1
        self.accepted[b] += accepted


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

    @property
    def hit_rate(self) -> float:
        return self.hits / self.rejections if self.rejections else 0.0


def plan(qs: np.ndarray, drafts: np.ndarray, acc: AcceptanceModel, cfg: CacheConfig,
         saved_s: float, token_s: float, kv_per_token: float, draft_ms: float,
         down_per_node: float, ranks: np.ndarray | None = None) -> list[Branch]:
    """Branches worth building for one chunk: drafts [n] drawn from qs [n, V]; guesses are
    ranked by `ranks` [n, V] (the drafter's plain softmax) when given, else by q."""
    cands, reach = [], 1.0
    ranks = qs if ranks is None else ranks
    for j, (q, r, x) in enumerate(zip(qs, ranks, drafts)):
        a = acc.p(float(q[x]))
        rej = reach * (1 - a)
        others = np.argsort(-r)[: cfg.guesses + 1]
        rest = max(1e-9, 1 - float(r[x]))
        for c in (int(t) for t in others if t != x):
            p_c = float(r[c]) / rest
            if p_c <= 0:
                continue
            root = (j, c, 0)
            cands.append(Candidate(root, None, rej * p_c * saved_s,
                                   (kv_per_token, draft_ms, 3.0, down_per_node, 1.0)))
            for k in range(1, cfg.branch_depth + 1):
                cands.append(Candidate((j, c, k), (j, c, k - 1),
                                       rej * p_c * a ** k * token_s,
                                       (kv_per_token, draft_ms, 1.5, down_per_node, 1.0)))
        reach *= a
    if not cands:
        return []
    chosen = allocate(cands, cfg.budgets()).selected
    depth: dict[tuple[int, int], int] = {}
    for j, c, k in chosen:
        depth[(j, c)] = max(depth.get((j, c), 0), k)
    return [Branch(j, c, d) for (j, c), d in sorted(depth.items())]


__all__ = ["AcceptanceModel", "Branch", "BUDGETS", "CacheConfig", "CacheStats", "plan"]
