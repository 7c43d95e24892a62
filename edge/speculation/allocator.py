"""Lagrangian sizing of the speculation tree (docs/design.md §6): which branches to pre-build
and upload.

Each candidate b is a tree node (a branch's first token, or a draft below it) with a value
v_b >= 0 (expected seconds saved) and costs c_b in K budgets (edge KV bytes, draft time, uplink
bytes, downlink bytes, cloud nodes). A candidate needs its parent (prefix closure). For prices
lambda_k = mu * w_k, the relaxed problem "max sum (v_b - lambda . c_b) over closed sets" is
solved exactly on the forest by a DP; the selected sets are nested (they shrink as mu grows),
so the smallest feasible mu, found on a fixed grid, gives a solution that respects every budget,
and a larger budget never selects less (so never lowers the expected value). The weights w_k
depend only on the candidates (1 / their total cost in budget k), not on the budgets.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

BUDGETS = ("edge_kv_bytes", "draft_ms", "uplink_bytes", "downlink_bytes", "cloud_nodes")


@dataclass(frozen=True)
class Candidate:
    key: Hashable
    parent: Hashable | None  # a candidate's key, or None: hangs off the existing tree
    value: float  # expected saving, >= 0
    costs: tuple[float, ...]  # [K] one per budget, >= 0


@dataclass(frozen=True)
class Allocation:
    selected: tuple[Hashable, ...]  # keys, parents before children
    value: float
    used: np.ndarray  # [K] float64 cost used per budget
    prices: np.ndarray  # [K] float64 the multipliers lambda_k in force


def allocate(cands: Sequence[Candidate], budgets: Sequence[float], grid: int = 48) -> Allocation:
    """Select a prefix-closed set of candidates within `budgets` ([K]); see module doc."""
    budgets = np.asarray(budgets, dtype=np.float64)
    if not cands:
        return Allocation((), 0.0, np.zeros_like(budgets), np.zeros_like(budgets))
    value = np.array([max(0.0, c.value) for c in cands])
    cost = np.array([c.costs for c in cands], dtype=np.float64)  # [n, K]
    if cost.shape[1] != len(budgets) or (cost < 0).any():
        raise ValueError("every candidate needs one non-negative cost per budget")
    forest = _forest(cands)
    total = cost.sum(axis=0)
    w = np.divide(1.0, total, out=np.zeros_like(total), where=total > 1e-12)  # [K]
    # Several fixed price directions (uniform, and each budget priced 10x): each gives a
    # nested, budget-monotone solution; the best of them is still monotone in the budgets.
    directions = [w] + [w * (1 + 9 * np.eye(len(w))[k]) for k in range(len(w))]
    best = None
    for d in directions:
        sel, mu = _smallest_feasible_price(forest, value, cost @ d, cost, budgets, grid)
        if best is None or value[sel].sum() > value[best[0]].sum():
            best = (sel, d * mu)
    return _result(cands, forest.order, best[0], value, cost, best[1])


def _smallest_feasible_price(forest, value, priced, cost, budgets, grid):
    """The smallest mu (on a fixed two-level grid that depends only on the candidates, so
    the answer is monotone in the budgets) whose selection max sum(value - mu * priced)
    fits. Every level of the grid is solved at once: weights are [n, M]."""
    with np.errstate(over="ignore", divide="ignore"):
        ratio = value[priced > 0] / priced[priced > 0]
    top = min(max(float(ratio.max()) if ratio.size else 0.0, 1e-12), 1e200) * 1.000001  # none pays
    coarse = np.concatenate([[0.0], top * np.logspace(-6, 0, grid - 1)])  # [M]

    def first_feasible(mus: np.ndarray) -> tuple[int, np.ndarray]:
        sel = _closure(forest, value[:, None] - priced[:, None] * mus[None, :])  # [n, M]
        ok = (cost.T @ sel <= budgets[:, None] + 1e-9).all(axis=0)  # [M]
        if not ok.any():  # over budget even on unpriced dimensions: take nothing
            return -1, np.zeros(len(value), bool)
        i = int(np.argmax(ok))
        return i, sel[:, i] > 0

    i, sel = first_feasible(coarse)
    if i <= 0:
        return sel, 0.0 if i == 0 else top
    fine = np.linspace(coarse[i - 1], coarse[i], grid)[1:]
    j, sel = first_feasible(fine)
    return sel, float(fine[j])


@dataclass(frozen=True)
class _Forest:
    order: list[int]  # parents before children
    parent: np.ndarray  # [n] index, -1 for a root
    levels: list[np.ndarray]  # node indices by depth, roots first


def _forest(cands) -> _Forest:
    """Topological order, parent index (-1: a root; a parent that is not a candidate is
    part of the existing tree) and the nodes of each depth."""
    index = {c.key: i for i, c in enumerate(cands)}
    if len(index) != len(cands):
        raise ValueError("candidate keys must be unique")
    children = [[] for _ in cands]
    parent = np.full(len(cands), -1)
    roots = []
    for i, c in enumerate(cands):
        p = index.get(c.parent) if c.parent is not None else None
        if p is None:
            roots.append(i)
        else:
            children[p].append(i)
            parent[i] = p
    order, depth, stack = [], np.zeros(len(cands), int), roots[::-1]
    while stack:
        i = stack.pop()
        order.append(i)
        for c in children[i][::-1]:
            depth[c] = depth[i] + 1
            stack.append(c)
    if len(order) != len(cands):
        raise ValueError("candidate parents form a cycle")
    levels = [np.nonzero(depth == d)[0] for d in range(int(depth.max()) + 1)]
    return _Forest(order, parent, levels)


def _closure(forest: _Forest, weight: np.ndarray) -> np.ndarray:
    """Max-weight prefix-closed selections on the forest, one per column of weight [n, M]:
    subtree gains bottom-up by level, then a node is taken iff its subtree gains and its
    parent is taken. Returns [n, M] float 0/1."""
    best = weight.copy()
    for lv in reversed(forest.levels[1:]):
        np.add.at(best, forest.parent[lv], np.maximum(best[lv], 0.0))
    sel = best > 0
    for lv in forest.levels[1:]:
        sel[lv] &= sel[forest.parent[lv]]
    return sel.astype(np.float64)


def _result(cands, order, sel, value, cost, prices) -> Allocation:
    keys = tuple(cands[i].key for i in order if sel[i])
    return Allocation(keys, float(value[sel].sum()), cost[sel].sum(axis=0), prices)
