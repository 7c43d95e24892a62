"""The speculation tree's Lagrangian allocator: budgets hold, prefix closure, monotone in the
budget, degenerate cases; checked against brute force on small instances."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from acespec.edge.speculation.allocator import Candidate, allocate

K = 3


@st.composite
def instances(draw, max_n=9):
    n = draw(st.integers(0, max_n))
    cands = []
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        cands.append(Candidate(i, parent, draw(st.floats(0, 10)),
                               tuple(draw(st.floats(0, 5)) for _ in range(K))))
    budgets = [draw(st.floats(0, 20)) for _ in range(K)]
    return cands, budgets


def _closed(cands, keys) -> bool:
    chosen = set(keys)
    return all(c.parent is None or c.parent in chosen for c in cands if c.key in chosen)


@settings(max_examples=300, deadline=None)
@given(instances())
def test_budgets_hold_and_selection_is_prefix_closed(inst):
    cands, budgets = inst
    a = allocate(cands, budgets)
    assert (a.used <= np.array(budgets) + 1e-9).all()
    assert _closed(cands, a.selected)
    assert a.value == sum(c.value for c in cands if c.key in set(a.selected))


@settings(max_examples=300, deadline=None)
@given(instances(), st.lists(st.floats(0, 10), min_size=K, max_size=K))
def test_larger_budget_never_lowers_value(inst, extra):
    cands, budgets = inst
    small = allocate(cands, budgets)
    large = allocate(cands, [b + e for b, e in zip(budgets, extra)])
    assert large.value >= small.value - 1e-9


def test_close_to_brute_force_on_small_instances():
    """Exhaustive optimum vs the allocator over 200 seeded random instances: the allocator
    is a Lagrangian heuristic, so it may fall short; on average it must reach >= 80 %."""
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(200):
        n = 7
        cands = [Candidate(i, (int(rng.integers(0, i)) if i and rng.random() < 0.6 else None),
                           float(rng.random() * 10), tuple(rng.random(K) * 5)) for i in range(n)]
        budgets = rng.random(K) * 12
        best = 0.0
        for mask in itertools.product([0, 1], repeat=n):
            keys = [i for i in range(n) if mask[i]]
            cost = np.sum([cands[i].costs for i in keys], axis=0) if keys else np.zeros(K)
            if (cost <= budgets).all() and _closed(cands, keys):
                best = max(best, sum(cands[i].value for i in keys))
        got = allocate(cands, budgets).value
        assert got <= best + 1e-9
        ratios.append(got / best if best else 1.0)
    print(f"allocator / optimum: mean {np.mean(ratios):.3f}, min {np.min(ratios):.3f}")
    assert np.mean(ratios) >= 0.8, np.mean(ratios)


def test_degenerate_cases():
    one = [Candidate("a", None, 2.0, (1.0, 1.0, 1.0))]
    assert allocate([], [1, 1, 1]).selected == ()
    assert allocate(one, [0, 0, 0]).selected == ()  # no budget
    assert allocate(one, [1, 1, 1]).selected == ("a",)
    assert allocate(one, [1, 0.5, 1]).selected == ()
    chain = [Candidate("a", None, 0.0, (1, 0, 0)), Candidate("b", "a", 5.0, (1, 0, 0))]
    assert allocate(chain, [2, 0, 0]).selected == ("a", "b")  # a worthless prefix is taken for b
    assert allocate(chain, [1, 0, 0]).selected == ()  # b alone would break closure


def test_against_the_exact_milp_optimum_on_tree_instances():
    """Speculation-tree-sized instances (30 nodes: chains with branches, prefix closure as
    x_child <= x_parent) solved exactly by scipy.optimize.milp: the allocator never exceeds
    the optimum (it is feasible) and reaches >= 80 % of it on average."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    rng = np.random.default_rng(3)
    ratios = []
    for _ in range(40):
        n = 30
        cands = [Candidate(i, (int(rng.integers(max(0, i - 4), i)) if i and rng.random() < 0.8
                               else None), float(rng.random() * 10), tuple(rng.random(K) * 5))
                 for i in range(n)]
        budgets = rng.random(K) * 30 + 5
        cost = np.array([c.costs for c in cands]).T  # [K, n]
        closure = [np.eye(n)[i] - np.eye(n)[c.parent] for i, c in enumerate(cands)
                   if c.parent is not None]  # x_i - x_parent <= 0
        cons = [LinearConstraint(cost, -np.inf, budgets)]
        if closure:
            cons.append(LinearConstraint(np.array(closure), -np.inf, 0))
        res = milp(-np.array([c.value for c in cands]), constraints=cons,
                   integrality=np.ones(n), bounds=Bounds(0, 1))
        assert res.success
        best = -res.fun
        got = allocate(cands, budgets)
        assert (got.used <= budgets + 1e-9).all() and got.value <= best + 1e-6
        ratios.append(got.value / best if best else 1.0)
    print(f"allocator / milp optimum: mean {np.mean(ratios):.3f}, min {np.min(ratios):.3f}")
    assert np.mean(ratios) >= 0.8, np.mean(ratios)
