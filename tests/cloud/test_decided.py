"""The decided session (acespec.cloud.verify.decided) on a toy target whose next token is a
known function of the context, with the edge's drafts sent as chains (Grow messages with no
branches): the walk after a pass, continuation with no drafts, and reconciliation of drafts
that arrive after the verifier decided past their position."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.cloud.errors import InvalidArgument
from acespec.cloud.verify.decided import ROOT, DecidedSession, DecideLimits
from acespec.shared.served import ServeParams

V = 50
GREEDY = ServeParams()


def target(context: list[int]) -> int:
    """The toy target's greedy next token."""
    return (7 * context[-1] + 3 * len(context)) % V


def truth(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(target(seq))
    return seq[len(prompt):]


def run_pass(s: DecidedSession) -> tuple[int, list[int]]:
    """One pass: logits rows [1 + n, V] for the planned inputs, as the model would give."""
    inputs = s.plan_pass()
    ctx = s.tokens[:-1]
    rows = []
    for t in inputs:
        ctx = ctx + [t]
        row = np.zeros(V, np.float32)
        row[target(ctx)] = 10.0
        rows.append(row)
    return s.finish_pass(np.stack(rows), 0.01)


def session(max_tokens=40, **kw) -> DecidedSession:
    return DecidedSession([1, 2, 3], GREEDY, 0, DecideLimits(max_tokens=max_tokens, **kw))


def grow_chain(s: DecidedSession, tokens: list[int], anchor: int | None = None,
               after: int = ROOT) -> int:
    """The edge's chain as one Grow with no branches: `tokens` after node `after` (ROOT:
    after the decided text up to `anchor`, by default all of it). Returns its last node."""
    first = s.next_id
    s.apply_grow(s.end if anchor is None else anchor,
                 [after] + list(range(first, first + len(tokens) - 1)), tokens)
    return s.next_id - 1


def test_continuation_decides_one_token_per_pass_with_no_drafts():
    s = session(max_tokens=5)
    out = []
    while not s.done:
        start, new = run_pass(s)
        assert start == 3 + len(out) and len(new) == 1
        out += new
    assert out == truth([1, 2, 3], 5) and s.counts.continuation == 5 and s.counts.passes == 5


def test_accepted_drafts_and_bonus_in_one_pass():
    s = session()
    want = truth([1, 2, 3], 6)
    grow_chain(s, want[:4])
    start, new = run_pass(s)
    assert (start, new) == (3, want[:5])  # 4 accepted drafts + the bonus
    assert s.counts.drafts_scored == 4 and s.counts.continuation == 1


def test_rejection_keeps_the_correction_and_kills_what_follows():
    s = session()
    want = truth([1, 2, 3], 6)
    drafts = [want[0], want[1], (want[2] + 1) % V, 9, 9]
    grow_chain(s, drafts)
    _, new = run_pass(s)
    assert new == want[:3]  # two accepted, then the correction
    assert s.pending() == []  # the drafts after the rejection are dead: no pass is spent
    _, new = run_pass(s)  # the verifier continues on its own
    assert new == want[3:4] and s.counts.drafts_scored == 5


def test_stale_drafts_matching_decided_tokens_are_reconciled_without_a_pass():
    s = session()
    want = truth([1, 2, 3], 10)
    for _ in range(3):
        run_pass(s)  # the verifier decided 3 tokens while the edge's chunk travelled
    grow_chain(s, want[:6], anchor=3)
    assert s.counts.drafts_reconciled == 3 and s.pending() == want[3:6]
    _, new = run_pass(s)
    assert new == want[3:7] and s.tokens[3:] == want[:7]


def test_stale_drafts_mismatching_at_the_first_are_all_dead():
    s = session()
    want = truth([1, 2, 3], 10)
    run_pass(s)
    run_pass(s)
    grow_chain(s, [(want[0] + 1) % V] + want[1:6], anchor=3)
    assert s.pending() == [] and s.counts.drafts_reconciled == 0
    passes = s.counts.passes
    _, new = run_pass(s)
    assert new == want[2:3] and s.counts.drafts_scored == 0 and s.counts.passes == passes + 1
    assert s.counts.dead_skipped() == 6


def test_a_chunk_after_the_chains_last_node_continues_the_chain():
    """The edge sends its chain in two chunks; the second's first parent is the first's
    last node."""
    s = session()
    want = truth([1, 2, 3], 10)
    tip = grow_chain(s, want[:3])
    grow_chain(s, want[3:7], after=tip)
    assert s.pending() == want[:7]
    _, new = run_pass(s)
    assert new == want[:8]


def test_a_rewound_edge_replaces_its_dead_chain():
    """After learning of a rejection the edge drafts again from the decided end."""
    s = session()
    want = truth([1, 2, 3], 10)
    grow_chain(s, [want[0], 0, 0, 0])
    _, new = run_pass(s)
    assert new == want[:2]
    grow_chain(s, want[2:6], anchor=5)
    assert s.pending() == want[2:6]
    _, new = run_pass(s)
    assert new == want[2:7]


def test_impossible_nodes_are_invalid_arguments():
    s = session(vocab=V)
    with pytest.raises(InvalidArgument, match="builds on 9 decided positions"):
        grow_chain(s, [1], anchor=9)  # the edge cannot know more decided tokens than exist
    with pytest.raises(InvalidArgument, match="builds on 2 decided positions"):
        grow_chain(s, [1], anchor=2)  # nor fewer than the prompt
    with pytest.raises(InvalidArgument, match="token id 50 is outside the vocabulary"):
        grow_chain(s, [1, V])
    assert s.next_id == 0 and not s.nodes  # a refused message adds nothing


def test_drafts_after_continuation_past_the_edges_old_chain():
    """The verifier decided past the end of everything the edge sent; the edge, having
    learned those tokens, drafts from its new committed end: no gap."""
    s = session()
    want = truth([1, 2, 3], 10)
    grow_chain(s, [want[0]])
    for _ in range(3):
        run_pass(s)
    assert s.end == 3 + 4 and s.next_id == 1  # the edge sent one draft
    grow_chain(s, want[3:7], anchor=6)
    assert s.counts.drafts_reconciled == 1 and s.pending() == want[4:7]


def test_stop_token_and_max_tokens_end_the_session():
    want = truth([1, 2, 3], 10)
    s = session(stop=frozenset({want[2]}))
    grow_chain(s, want[:6])
    _, new = run_pass(s)
    assert new == want[:3] and s.done
    # every draft is counted once: 6 scored (the pass fed them all), none dead
    assert (s.counts.drafts_scored, s.counts.dead_skipped()) == (6, 0)
    s = session(max_tokens=2)
    grow_chain(s, want[:6])
    _, new = run_pass(s)
    assert new == want[:2] and s.done


def test_context_limit_ends_the_session():
    s = DecidedSession([1, 2, 3], GREEDY, 0, DecideLimits(max_tokens=100, context=6))
    grow_chain(s, truth([1, 2, 3], 8))
    out = []
    while not s.done:
        out += run_pass(s)[1]
    assert len(out) == 3 and s.end == 6


def check_counts(s, sent: int) -> None:
    """Every draft the edge sent was counted on arrival, and none was scored or settled
    by comparison twice (dead = received - scored - reconciled, within [0, sent])."""
    assert s.counts.drafts_received == sent
    assert 0 <= s.counts.dead_skipped() <= sent


def test_every_draft_is_accounted_once_under_random_interleavings():
    """An edge that drafts (70 % right), a verifier that passes, and a link that delivers in
    order, interleaved at random; stop tokens and max_tokens end sessions mid-chain. The
    edge's view of the decided text always matches, and no draft is counted twice (dead =
    received - scored - reconciled stays >= 0)."""
    rng = np.random.default_rng(0)
    for trial in range(400):
        want = truth([1, 2, 3], 40)
        stop = frozenset({want[int(rng.integers(5, 40))]}) if trial % 2 else frozenset()
        s = session(max_tokens=int(rng.integers(5, 30)), stop=stop)
        committed, chain, tip, downlink, sent = 3, [], ROOT, [], 0
        while not s.done:
            if rng.random() < 0.6 and len(chain) < 8:
                at = committed + len(chain)
                toks = [want[p - 3] if rng.random() < 0.7 else int(rng.integers(V))
                        for p in range(at, at + int(rng.integers(1, 4)))]
                tip = grow_chain(s, toks, after=tip) if chain else \
                    grow_chain(s, toks, anchor=committed)
                chain += toks
                sent += len(toks)
            if rng.random() < 0.5:
                downlink.append(run_pass(s))
            if downlink and rng.random() < 0.5:
                start, new = downlink.pop(0)
                assert start == committed
                for t in new:
                    chain = chain[1:] if chain and chain[0] == t else []
                    committed += 1
            check_counts(s, sent)
        assert s.tokens[3:] == want[:len(s.tokens) - 3]
