"""The edge's speculation tree (acespec.edge.speculation.grow_tree): path probabilities, re-rooting on
decided tokens (accepted / hit / rejected / continuation), freeing the drafter sequences of
dead subtrees, and the choice of leaves within budgets."""

from __future__ import annotations

import numpy as np

from acespec.edge.speculation.branches import NodeCosts
from acespec.edge.speculation.calibration import AcceptanceModel, RecoveryModel
from acespec.edge.speculation.grow_tree import (
    ACCEPTED,
    CONTINUATION,
    HIT,
    REJECTED,
    GrowBudget,
    GrowTree,
)

V = 20


def ranks(top: list[int], probs: list[float]) -> np.ndarray:
    r = np.full(V, (1 - sum(probs)) / (V - len(top)))
    r[top] = probs
    return r


def grown_tree() -> GrowTree:
    """Root (position 9) -> draft 5 (guesses 6, 7) ; 5 -> draft 8 (guess 9)."""
    t = GrowTree(last_token=1, end=10, acc=AcceptanceModel(), guesses_per_node=2)
    rec = RecoveryModel(2)
    t.expand(t.root, 5, ranks([5, 6, 7], [0.5, 0.3, 0.1]), rec)
    t.expand(t.root.children[5], 8, ranks([8, 9], [0.6, 0.3]), rec)
    assert len(t.guess(t.walk(), lambda p, lead: 1.0, room=3)) == 3  # 6, 7 under the root; 9 under 5
    return t


def test_path_probabilities_and_guesses():
    t = grown_tree()
    p = {n.token: q for n, q in t.nodes()}
    assert set(p) == {5, 6, 7, 8, 9}
    assert p[5] > p[6] > p[7] > 0  # the draft first, then the guesses by rank
    assert abs(p[8] - p[5] * t.odds(t.root.children[5].children[8])) < 1e-12
    assert sum(p[k] for k in (5, 6, 7)) <= 1 + 1e-9  # children of one node: disjoint events
    assert [n.token for n in t.unsent] == [5, 8, 6, 7, 9]  # parents before children
    assert t.shape() == (3, 2)  # width 3 at position 10, depth 2 ahead


def test_guesses_wait_until_they_are_worth_their_cost_and_odds_follow_calibration():
    t = GrowTree(last_token=1, end=10, acc=AcceptanceModel(), guesses_per_node=2)
    rec = RecoveryModel(2)
    node = t.root
    for tok in (5, 5, 5, 5, 6):  # a drafted line of five, each drafted at confidence 0.9
        node = t.expand(node, tok, ranks([tok, 3], [0.9, 0.09]), rec)
    deep = [n for n, p in t.nodes() if n.position == 14][0]
    before = t.odds(deep)
    got = t.guess(t.walk(), lambda p, lead: p - 0.15, room=9)  # only the shallow guesses pay for themselves
    assert [n.position for n in got] == [10, 11]
    for _ in range(50):
        t.acc.update(0.9, True)  # the calibration learns the drafts are good
    assert t.odds(deep) > before
    assert len(t.guess(t.walk(), lambda p, lead: p, room=1)) == 1  # the room binds


def test_take_reroots_and_reports_the_verdict():
    t = grown_tree()
    assert t.take(5) == ACCEPTED and t.root.token == 5 and t.end == 11
    assert set(t.root.children) == {8, 9}
    assert t.take(9) == HIT and t.root.token == 9  # the guessed token was decided
    assert t.take(3) == CONTINUATION and not t.root.children
    t = grown_tree()
    assert t.take(4) == REJECTED and not t.root.children and t.root.token == 4


def test_dead_subtrees_give_their_drafter_sequences_back():
    t = grown_tree()
    six = t.root.children[6]
    six.seq, t.root.children[5].seq, t.root.seq = 3, 2, 1
    assert t.take(5) == ACCEPTED
    assert t.dropped_seqs == [3, 1]  # the guess's branch died; the old root's sequence too
    assert t.root.seq == 2


def test_select_respects_every_budget_and_more_budget_never_selects_less():
    t = grown_tree()
    cands = [(n, float(v)) for (n, _, _), v in zip(t.leaves(t.walk(), max_position=100),
                                               [5.0, 3.0, 2.0, 1.0])]
    costs = NodeCosts(kv_per_token=100.0, up_per_node=2.0)
    prev = -1.0
    for nodes in range(0, 5):
        got = t.select(cands, GrowBudget(nodes=nodes, kv_bytes=1e9, uplink_bytes=1e9, batch=8),
                       costs)
        assert len(got) <= nodes
        value = sum(v for n, v in cands if n in got)
        assert value >= prev
        prev = value
    got = t.select(cands, GrowBudget(nodes=9, kv_bytes=250, uplink_bytes=1e9, batch=8), costs)
    assert len(got) == 2 and got == [cands[0][0], cands[1][0]]  # KV for two cells, best two
    got = t.select(cands, GrowBudget(nodes=9, kv_bytes=1e9, uplink_bytes=3, batch=8), costs)
    assert len(got) == 1
    got = t.select(cands, GrowBudget(nodes=9, kv_bytes=1e9, uplink_bytes=1e9, batch=2), costs)
    assert len(got) == 2  # one decode grows at most `batch` leaves
