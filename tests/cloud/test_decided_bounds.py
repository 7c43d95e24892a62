"""A decided session holds O(pending) state however its edge behaves: Grow is capped
(RESOURCE_EXHAUSTED naming the limit), and nodes that die are freed when they die."""

from __future__ import annotations

import pytest

from acespec.cloud.errors import ResourceExhausted
from acespec.cloud.verify.decided import HORIZON, ROOT, DecideLimits
from acespec.edge.session.config import MAX_WINDOW

from test_decided import run_pass, session, target


def test_dead_grow_nodes_are_forgotten_and_their_children_die_at_once():
    s = session(max_tokens=10_000, pass_nodes=64)
    for _ in range(300):  # 300 x 500 nodes under a wrong guess: dead at the next pass
        first, wrong = s.next_id, (target(s.tokens) + 1) % 50
        s.apply_grow(s.end, [ROOT] + list(range(first, first + 499)), [wrong] * 500)
        run_pass(s)
        assert not s.live
    assert s.counts.drafts_received == 150_000 and len(s.nodes) <= 2 * HORIZON + 500
    first = s.next_id  # a child of a forgotten node is dead, not an error
    s.apply_grow(s.end, [0], [target(s.tokens)])
    assert s.next_id == first + 1 and first not in s.nodes and not s.live
    _, new = run_pass(s)  # decoding goes on, unharmed
    assert new == [target(s.tokens[:-1])]


def test_grow_over_its_cap_is_resource_exhausted():
    s = session(pass_nodes=4)
    with pytest.raises(ResourceExhausted, match="pending nodes would exceed 32"):
        s.apply_grow(s.end, [ROOT] + list(range(32)), [1] * 33)


def test_a_pass_applies_the_edges_largest_window():
    assert DecideLimits(max_tokens=1).applied_per_pass >= 2 * MAX_WINDOW
