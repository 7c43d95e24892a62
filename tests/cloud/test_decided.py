"""The verifier-decided session (acespec.cloud.verify.decided) on a toy target whose next token is
a known function of the context: the walk after a pass, continuation with no drafts, and
reconciliation of drafts that arrive after the verifier decided past their position."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.cloud.errors import InvalidArgument
from acespec.cloud.verify.decide import DecideLimits, decide
from acespec.cloud.verify.decided import DecidedSession
from acespec.shared.config import SamplingParams
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
    s.apply_drafts(3, 0, want[:4])
    start, new = run_pass(s)
    assert (start, new) == (3, want[:5])  # 4 accepted drafts + the bonus
    assert s.counts.drafts_scored == 4 and s.counts.continuation == 1


def test_rejection_keeps_the_correction_and_kills_what_follows():
    s = session()
    want = truth([1, 2, 3], 6)
    drafts = [want[0], want[1], (want[2] + 1) % V, 9, 9]
    s.apply_drafts(3, 0, drafts)
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
    s.apply_drafts(3, 0, want[:6])
    assert s.counts.drafts_reconciled == 3 and s.pending() == want[3:6]
    _, new = run_pass(s)
    assert new == want[3:7] and s.tokens[3:] == want[:7]


def test_stale_drafts_mismatching_at_the_first_are_all_dead():
    s = session()
    want = truth([1, 2, 3], 10)
    run_pass(s)
    run_pass(s)
    s.apply_drafts(3, 0, [(want[0] + 1) % V] + want[1:6])
    assert s.pending() == [] and s.counts.drafts_reconciled == 0
    passes = s.counts.passes
    _, new = run_pass(s)
    assert new == want[2:3] and s.counts.drafts_scored == 0 and s.counts.passes == passes + 1
    assert s.counts.dead_skipped() == 6


def test_drafts_starting_past_the_decided_end_continue_the_edges_chain():
    """The edge sends its chain in two chunks; the second builds on the first (behind=3)."""
    s = session()
    want = truth([1, 2, 3], 10)
    s.apply_drafts(3, 0, want[:3])
    s.apply_drafts(6, 3, want[3:7])
    assert s.pending() == want[:7]
    _, new = run_pass(s)
    assert new == want[:8]


def test_a_rewound_edge_replaces_its_dead_chain():
    """After learning of a rejection the edge drafts again from the decided end (behind=0)."""
    s = session()
    want = truth([1, 2, 3], 10)
    s.apply_drafts(3, 0, [want[0], 0, 0, 0])
    _, new = run_pass(s)
    assert new == want[:2]
    s.apply_drafts(5, 0, want[2:6])
    assert s.pending() == want[2:6]
    _, new = run_pass(s)
    assert new == want[2:7]


def test_impossible_claims_are_invalid_arguments():
    s = session()
    with pytest.raises(InvalidArgument, match="builds on"):
        s.apply_drafts(9, 0, [1])  # the edge cannot know more decided tokens than exist
    with pytest.raises(InvalidArgument, match="gap"):
        s.apply_drafts(8, 5, [1])


def test_drafts_after_continuation_past_the_edges_old_chain():
    """The verifier decided past the end of everything the edge sent; the edge, having
    learned those tokens, drafts from its new committed end (behind=0): no gap."""
    s = session()
    want = truth([1, 2, 3], 10)
    s.apply_drafts(3, 0, [want[0]])
    for _ in range(3):
        run_pass(s)
    assert s.end == 3 + 4 and max(s.chain) == 3  # the edge sent one draft
    s.apply_drafts(6, 0, want[3:7])
    assert s.counts.drafts_reconciled == 1 and s.pending() == want[4:7]


def test_stop_token_and_max_tokens_end_the_session():
    want = truth([1, 2, 3], 10)
    s = session(stop=frozenset({want[2]}))
    s.apply_drafts(3, 0, want[:6])
    _, new = run_pass(s)
    assert new == want[:3] and s.done
    # every draft is counted once: 6 scored (the pass fed them all), none dead
    assert (s.counts.drafts_scored, s.counts.dead_skipped()) == (6, 0)
    s = session(max_tokens=2)
    s.apply_drafts(3, 0, want[:6])
    _, new = run_pass(s)
    assert new == want[:2] and s.done


def test_context_limit_ends_the_session():
    s = DecidedSession([1, 2, 3], GREEDY, 0, DecideLimits(max_tokens=100, context=6))
    s.apply_drafts(3, 0, truth([1, 2, 3], 8))
    out = []
    while not s.done:
        out += run_pass(s)[1]
    assert len(out) == 3 and s.end == 6


def test_decide_is_a_function_of_seed_and_position():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=V).astype(np.float32)
    coupled = ServeParams(SamplingParams(temperature=0.8, coupled=True))
    sampled = ServeParams(SamplingParams(temperature=0.8))
    for params in (GREEDY, coupled, sampled):
        a = [decide(logits, params, 5, p) for p in range(20)]
        assert a == [decide(logits, params, 5, p) for p in range(20)]
    assert len({decide(logits, coupled, 5, p) for p in range(50)}) > 3  # it does vary


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
        committed, chain, downlink, sent = 3, [], [], 0
        while not s.done:
            if rng.random() < 0.6 and len(chain) < 8:
                at = committed + len(chain)
                toks = [want[p - 3] if rng.random() < 0.7 else int(rng.integers(V))
                        for p in range(at, at + int(rng.integers(1, 4)))]
                s.apply_drafts(at, len(chain), toks)
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
