"""Lagrangian sizing of the state cache (DESIGN §6): which branches to pre-build and upload.

Each candidate b is a tree node (a branch's first token, or a draft below it) with a value
v_b >= 0 (expected seconds saved) and costs c_b in K budgets (edge KV bytes, draft time, uplink
bytes, downlink bytes, cloud nodes). A candidate needs its parent (prefix closure). For prices
lambda_k = mu * w_k, the relaxed problem "max sum (v_b - lambda . c_b) over closed sets" is
solved exactly on the forest by a DP; the selected sets are nested (they shrink as mu grows),
so the smallest feasible mu, found by bisection, gives a solution that respects every budget,
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


def allocate(cands: Sequence[Candidate], budgets: Sequence[float], iters: int = 60) -> Allocation:
    """Select a prefix-closed set of candidates within `budgets` ([K]); see module doc."""
    budgets = np.asarray(budgets, dtype=np.float64)
    if not cands:
        return Allocation((), 0.0, np.zeros_like(budgets), np.zeros_like(budgets))
    value = np.array([max(0.0, c.value) for c in cands])
    cost = np.array([c.costs for c in cands], dtype=np.float64)  # [n, K]
    if cost.shape[1] != len(budgets) or (cost < 0).any():
        raise ValueError("every candidate needs one non-negative cost per budget")
    order, children, parent = _forest(cands)
    total = cost.sum(axis=0)
    w = np.divide(1.0, total, out=np.zeros_like(total), where=total > 1e-12)  # [K]
    # Several fixed price directions (uniform, and each budget priced 10x): each gives a
    # nested, budget-monotone solution; the best of them is still monotone in the budgets.
    directions = [w] + [w * (1 + 9 * np.eye(len(w))[k]) for k in range(len(w))]
    best = None
    for d in directions:
        sel, mu = _smallest_feasible_price(order, children, parent, value, cost @ d, cost,
                                           budgets, iters)
        if best is None or value[sel].sum() > value[best[0]].sum():
            best = (sel, d * mu)
    return _result(cands, order, best[0], value, cost, best[1])


def _smallest_feasible_price(order, children, parent, value, priced, cost, budgets, iters):
    """Bisection for the smallest mu whose selection max sum(value - mu * priced) fits."""
    def pick(mu: float) -> np.ndarray:
        return _closure(order, children, parent, value - mu * priced)

    def feasible(sel: np.ndarray) -> bool:
        return bool((cost[sel].sum(axis=0) <= budgets + 1e-9).all())

    if feasible(pick(0.0)):
        return pick(0.0), 0.0
    lo, hi = 0.0, 1.0
    while not feasible(pick(hi)):
        hi *= 2
        if hi > 1e12:  # over budget even on unpriced dimensions: take nothing
            return np.zeros(len(value), bool), hi
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if feasible(pick(mid)) else (mid, hi)
    return pick(hi), hi


def _forest(cands):
    """Topological order (parents first), children lists and parent index (-1: a root;
    a parent that is not a candidate is part of the existing tree)."""
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
    order, stack = [], roots[::-1]
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(children[i][::-1])
    if len(order) != len(cands):
        raise ValueError("candidate parents form a cycle")
    return order, children, parent


def _closure(order, children, parent, weight: np.ndarray) -> np.ndarray:
    """Max-weight prefix-closed selection on a forest: DP bottom-up, then top-down."""
    best = weight.copy()
    for i in reversed(order):
        best[i] = weight[i] + sum(max(0.0, best[c]) for c in children[i])
    sel = np.zeros(len(weight), bool)
    for i in order:  # parents first: taken iff its subtree gains and its parent is taken
        sel[i] = best[i] > 0 and (parent[i] < 0 or sel[parent[i]])
    return sel


def _result(cands, order, sel, value, cost, prices) -> Allocation:
    keys = tuple(cands[i].key for i in order if sel[i])
    return Allocation(keys, float(value[sel].sum()), cost[sel].sum(axis=0), prices)
