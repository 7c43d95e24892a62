"""A decided session holds O(pending) state however its edge behaves: Drafts are capped like
Grow (RESOURCE_EXHAUSTED naming the limit), and nodes that die are freed when they die."""

from __future__ import annotations

import pytest

from acespec.cloud.errors import ResourceExhausted
from acespec.cloud.verify.decide import DecideLimits
from acespec.cloud.verify.decided import HORIZON, ROOT

from test_decided import run_pass, session, target, truth


def test_drafts_over_the_pending_cap_are_resource_exhausted():
    s = session(max_pending=100)
    s.apply_drafts(s.end, 0, [1] * 100)  # at the cap: fine (all pending)
    with pytest.raises(ResourceExhausted, match="would exceed 100; wait for Decided"):
        s.apply_drafts(s.end + 100, 100, [1])
    with pytest.raises(ResourceExhausted, match="would exceed 100"):
        s.apply_drafts(s.end, 0, [1] * 101)  # one message over it


def test_drafts_far_past_the_decided_text_are_refused_even_when_dead():
    s = session(max_pending=100)
    bad = (truth([1, 2, 3], 1)[0] + 1) % 50
    s.apply_drafts(s.end, 0, [bad] * 50)
    run_pass(s)  # the chain dies at its first node: everything after it is dead
    assert not s.live
    with pytest.raises(ResourceExhausted, match="positions past the decided text"):
        for _ in range(10):  # each continues the dead chain further ahead
            pos = max(s.chain) + 1
            s.apply_drafts(pos, pos - s.end, [1] * 60)


def test_dead_drafts_are_forgotten_as_they_die():
    s = session(max_tokens=10_000)
    wrong = (truth([1, 2, 3], 1)[0] + 1) % 50
    for _ in range(200):  # 200 x 1,000 drafts, each chain replaced by the next: all die
        s.apply_drafts(s.end, 0, [wrong] * 1000)
    assert s.counts.drafts_received == 200_000
    assert len(s.nodes) <= 2 * HORIZON + 1000 and len(s.chain) <= 1000 + HORIZON
    run_pass(s)
    assert len(s.live) == 0 and len(s.nodes) <= 2 * HORIZON + 1000


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


def test_limits_default_allows_the_edges_largest_window():
    from acespec.edge.session.config import MAX_WINDOW

    assert DecideLimits(max_tokens=1).max_pending >= 2 * MAX_WINDOW
