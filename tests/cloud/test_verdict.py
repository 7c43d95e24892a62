"""Verdicts (acespec.cloud.verify.verdict): the rule is a function of (seed, position, p~),
and the walk of a scored pass follows whichever child it decides."""

from __future__ import annotations

import numpy as np

from acespec.cloud.verify.verdict import FIRST, decide, walk
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams

V = 50
GREEDY = ServeParams()


def onehot_rows(tokens: list[int]) -> np.ndarray:
    """Logits rows [len(tokens), V], each peaked at its token."""
    rows = np.zeros((len(tokens), V), np.float32)
    rows[np.arange(len(tokens)), tokens] = 10.0
    return rows


def argmax(row: np.ndarray, new: list[int]) -> int:
    return int(row.argmax())


def test_decide_is_a_function_of_seed_and_position():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=V).astype(np.float32)
    coupled = ServeParams(SamplingParams(temperature=0.8, coupled=True))
    sampled = ServeParams(SamplingParams(temperature=0.8))
    for params in (GREEDY, coupled, sampled):
        a = [decide(logits, params, 5, p) for p in range(20)]
        assert a == [decide(logits, params, 5, p) for p in range(20)]
    assert len({decide(logits, coupled, 5, p) for p in range(50)}) > 3  # it does vary


def test_walk_takes_the_accepted_line_and_a_bonus():
    # a line 5 -> 6 -> 7; the rows say 5, 6, 7, then 8 after the last node
    w = walk([FIRST, 0, 1], [5, 6, 7], onehot_rows([5, 6, 7, 8]), argmax, frozenset())
    assert (w.tokens, w.path, w.hits, w.restarted) == ([5, 6, 7, 8], [0, 1, 2], 0, False)
    assert w.rows() == [0, 1, 2, 3]


def test_walk_stops_at_a_rejection_with_the_recovered_token():
    w = walk([FIRST, 0, 1], [5, 6, 7], onehot_rows([5, 9, 7, 8]), argmax, frozenset())
    assert (w.tokens, w.path) == ([5, 9], [0])


def test_walk_enters_a_guess_and_counts_the_hit():
    # node 0 = 5 at the decided end; its children: the draft 6 (node 1), the guess 9 (node 2),
    # and below the guess node 3 = 4. The target says 5, 9, 4, then 1.
    parents, tokens = [FIRST, 0, 0, 2], [5, 6, 9, 4]
    rows = onehot_rows([5, 9, 0, 4, 1])  # rows: first input, then nodes 0..3
    w = walk(parents, tokens, rows, argmax, frozenset())
    assert (w.tokens, w.path, w.hits, w.restarted) == ([5, 9, 4, 1], [0, 2, 3], 1, False)
    assert w.rows() == [0, 1, 3, 4]


def test_walk_ending_on_a_guess_with_nothing_below_it_restarts():
    w = walk([FIRST, 0, 0], [5, 6, 9], onehot_rows([5, 9, 0, 3]), argmax, frozenset())
    assert (w.tokens, w.path, w.hits, w.restarted) == ([5, 9, 3], [0, 2], 1, True)


def test_walk_ends_at_a_stop_token_even_with_a_child_holding_it():
    w = walk([FIRST, 0], [5, 6], onehot_rows([5, 6, 7]), argmax, frozenset({5}))
    assert (w.tokens, w.path) == ([5], [])


def test_walk_passes_the_tokens_decided_so_far_to_the_rule():
    seen = []

    def rule(row: np.ndarray, new: list[int]) -> int:
        seen.append(list(new))
        return int(row.argmax())

    walk([FIRST, 0], [5, 6], onehot_rows([5, 6, 7]), rule, frozenset())
    assert seen == [[], [5], [5, 6]]
