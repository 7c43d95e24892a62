"""The tree walk is exactly lossless: emitted tokens follow p~, with sparse downlinks, tails,
MoreTail, guessed branches and bonus branches.

Statistical tests, fixed seeds. Single position: N = 30,000 trials per (p~, q) pair, TV from
p~ < 0.02 (sampling noise alone ~0.008 for 8 tokens). Two positions: N = 40,000, TV of the
joint (t1, t2) from p~1(t1) p~2(t2|t1) < 0.025 over 36 cells (noise ~0.013).
"""

from __future__ import annotations

import numpy as np
import pytest

from acespec.shared.config import SamplingParams
from acespec.shared.served import UNITS, ServeParams, n_sent, node_score, served, tail_draws
from acespec.shared.walk import NeedTail, Node, walk

SEED = 77


def _params(send_mass: float, m: int = 1) -> ServeParams:
    return ServeParams(SamplingParams(temperature=1.0), send_mass=send_mass, tail_samples=m)


def _scored(node: Node, logits: np.ndarray, params: ServeParams, self_units: int,
            seed: int = SEED) -> None:
    """Score a node as the verifier would; `seed` is the session seed (one per trial)."""
    key = (logits.tobytes(), params)
    if key not in _DISTS:
        _DISTS[key] = served(logits, params)
    dist = _DISTS[key]
    node.score = node_score(dist, params, node.node_id, self_units, seed)
    node._seed = seed
    node.tails = list(zip(node.score.tail_ids.tolist(), node.score.tail_sample_units.tolist()))
    node._dist = dist  # kept by the test to serve MoreTail


_DISTS: dict = {}


def _walk_with_more_tail(root, rng_at, params):
    nodes = {}
    stack = [root]
    while stack:
        n = stack.pop()
        nodes[n.node_id] = n
        stack.extend(n.children.values())
    while True:
        try:
            return walk(root, False, rng_at)
        except NeedTail as e:
            n = nodes[e.node_id]
            sent = n_sent(n._dist, params.send_mass)
            ids, units = tail_draws(n._dist, sent, n._seed, n.node_id, len(n.tails), 2)
            n.tails += list(zip(ids.tolist(), units.tolist()))


def _probs_of(dist, vocab):
    p = np.zeros(vocab)
    p[dist.ids] = dist.units / UNITS
    return p


PAIRS = {
    "heavy_tail_small_send_mass": ([4, 3, 2.5, 2, 1.5, 1, 0.5, 0], [0, 1, 2, 3, 4, 5, 6, 7], 0.3),
    "q_mass_on_tail": ([3, 2.9, 1, 0.9, 0.8, 0.7, 0.6, 0.5], [0, 0, 0, 0, 4, 4, 4, 4], 0.2),
    "close": ([2, 1.5, 1, 0.5, 0, -0.5, -1, -1.5], [2, 1.4, 1.1, 0.5, 0, -0.4, -1, -2], 0.9),
    "point_mass_q": ([1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 30, 0], 0.05),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_first_token_follows_p(name):
    p_logits, q_logits, send_mass = (np.array(x, float) if isinstance(x, list) else x
                                     for x in PAIRS[name])
    params = _params(send_mass)
    vocab, n = len(p_logits), 30_000
    q = np.exp(q_logits - q_logits.max())
    q /= q.sum()
    target = _probs_of(served(p_logits, params), vocab)
    counts = np.zeros(vocab)
    draw_rng = np.random.default_rng(1)
    for trial in range(n):
        root = Node(0, token=0, position=10)
        _scored(root, p_logits, params, 0, seed=trial)
        x = int(draw_rng.choice(vocab, p=q))
        child = Node(1, token=x, position=11, q=q)
        _scored(child, p_logits, params, _units(root, x), seed=trial)  # self_p says p~(x)
        root.children[x], root.drafted = child, child
        res = _walk_with_more_tail(root, lambda pos, t=trial: np.random.default_rng([t, pos]),
                                   params)
        counts[res.tokens[0]] += 1
    tv = 0.5 * np.abs(counts / n - target).sum()
    assert tv < 0.02, f"{name}: TV {tv:.4f}"


@pytest.mark.slow
def test_two_positions_with_recovery_and_bonus_branches():
    vocab, n = 6, 40_000
    params = _params(0.4, m=1)
    rs = np.random.default_rng(5)
    p1_logits = rs.normal(0, 1.2, vocab)
    p2_logits = rs.normal(0, 1.2, (vocab, vocab))  # row t1: logits of t2 given t1
    q1 = rs.dirichlet(np.ones(vocab))
    q2 = rs.dirichlet(np.ones(vocab), size=vocab)
    p1 = _probs_of(served(p1_logits, params), vocab)
    p2 = np.stack([_probs_of(served(r, params), vocab) for r in p2_logits])
    guess = int(np.argmax(p1 - q1))  # the branch the speculation tree would pre-build
    joint = np.zeros((vocab, vocab))
    draw = np.random.default_rng(2)
    hits = 0
    for trial in range(n):
        rng_at = lambda pos, t=trial: np.random.default_rng([t, pos])  # noqa: E731
        root = Node(0, token=0, position=4)
        _scored(root, p1_logits, params, 0, seed=trial)
        x = int(draw.choice(vocab, p=q1))
        a = Node(1, token=x, position=5, q=q1)
        root.children[x], root.drafted = a, a
        _scored(a, p2_logits[x], params, _units(root, x), seed=trial)
        y = int(draw.choice(vocab, p=q2[x]))
        ay = Node(2, token=y, position=6, q=q2[x])
        _scored(ay, p1_logits, params, _units(a, y), seed=trial)
        a.children[y], a.drafted = ay, ay
        if guess != x:  # guessed branch: guessed token, not drafted, scored in the same pass
            b = Node(3, token=guess, position=5)
            _scored(b, p2_logits[guess], params, _units(root, guess), seed=trial)
            root.children[guess] = b  # no drafted child below b: its next token is a bonus
        res = _walk_with_more_tail(root, rng_at, params)
        hits += res.branch_hits
        t1 = res.tokens[0]
        t2 = res.tokens[1] if len(res.tokens) > 1 else int(draw.choice(vocab, p=p2[t1]))
        joint[t1, t2] += 1
    expect = p1[:, None] * p2
    tv = 0.5 * np.abs(joint / n - expect).sum()
    assert hits > 1000  # branches were really walked into
    assert tv < 0.025, f"TV {tv:.4f}"


def _units(node: Node, token: int) -> int:
    return node._dist.units_of(token)


def test_greedy_walk_follows_argmax_and_counts_hits():
    params = ServeParams()
    root = Node(0, token=0, position=0)
    root.score = node_score(served(np.array([0, 3.0, 1]), params), params, 0, 0, 0)
    wrong = Node(1, token=2, position=1, q=np.array([0, 0, 1.0]))
    branch = Node(2, token=1, position=1)
    branch.score = node_score(served(np.array([5.0, 0, 1]), params), params, 2, 0, 0)
    root.children = {2: wrong, 1: branch}
    root.drafted = wrong
    res = walk(root, True, lambda pos: np.random.default_rng(pos))
    assert res.tokens == [1, 0] and res.branch_hits == 1 and res.accepted == 0
    assert not res.waiting and res.end is branch


def test_walk_waits_for_unscored_draft():
    params = _params(0.5, m=0)  # no pre-drawn tail samples
    root = Node(0, token=0, position=0)
    _scored(root, np.array([0.0, 1.0, 2.0, -1.0]), params, 0)  # token 3 is in the tail
    child = Node(1, token=3, position=1, q=np.array([0, 0, 0, 1.0]))  # p~(3) not sent
    root.children[3], root.drafted = child, child
    res = walk(root, False, lambda pos: np.random.default_rng(pos))
    assert res.tokens == [] and res.waiting and res.end is root
