"""The verifier-decided session over the edge's speculation tree (Grow; docs/design.md §6): a pass
feeds the pending tree and the walk follows whichever child it decides, so a guessed
guessed branch that was already sent continues with no round trip; dead subtrees are never
scored; every node is accounted once."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.cloud.errors import InvalidArgument
from acespec.cloud.verify.decided import PENDING, ROOT, DecidedSession, DecideLimits
from acespec.proto.codec import WireError, decode_grow, encode_grow
from acespec.shared.served import ServeParams

from test_decided import V, check_counts, target, truth  # the same toy target


def onehot(tok: int) -> np.ndarray:
    row = np.zeros(V, np.float32)
    row[tok] = 10.0
    return row


def run_pass(s: DecidedSession) -> tuple[int, list[int]]:
    """One pass: logits rows [1 + n, V], each from its node's own context (its tree path)."""
    inputs = s.plan_pass()
    parents = s.pass_parents(1000)  # slots: 999 = the KV's last, 1000 = the first input
    ctxs = [s.tokens]
    for tok, p in zip(inputs[1:], parents[1:]):
        ctxs.append(ctxs[p - 1000] + [tok])
    return s.finish_pass(np.stack([onehot(target(c)) for c in ctxs]), 0.01)


def session(max_tokens=40, **kw) -> DecidedSession:
    return DecidedSession([1, 2, 3], ServeParams(), 0, DecideLimits(max_tokens=max_tokens, vocab=V, **kw))


def test_a_guessed_branch_continues_in_the_same_pass():
    """Main chain wrong at its third draft, a branch there holding the right token and two
    drafts after it: one pass decides the chain's two, the branch's three and a bonus."""
    s = session()
    want = truth([1, 2, 3], 10)
    wrong = (want[2] + 1) % V
    s.apply_grow(3, [ROOT, 0, 1, 2], [want[0], want[1], wrong, want[3]])
    s.apply_grow(3, [1, 4, 5], [want[2], want[3], want[4]])  # branch under node 1
    _, new = run_pass(s)
    assert new == want[:6]
    assert s.walked == [0, 1, 4, 5, 6]  # pass indices: the chain's two, then the branch
    assert not s.live and s.counts.passes == 1 and s.counts.continuation == 1


def test_a_branch_sent_after_its_correction_was_decided_is_matched_and_continues():
    """The verifier decided the correction before the branch arrived: the branch's guessed
    token is matched without a pass and its drafts are scored by the next one."""
    s = session()
    want = truth([1, 2, 3], 10)
    s.apply_grow(3, [ROOT, 0], [want[0], (want[1] + 1) % V])
    _, new = run_pass(s)
    assert new == want[:2]
    s.apply_grow(3, [0, 2, 3], [want[1], want[2], want[3]])
    assert s.counts.drafts_reconciled == 1 and s.pending() == want[2:4]
    _, new = run_pass(s)
    assert new == want[2:5]


def test_dead_subtrees_are_never_scored():
    s = session()
    want = truth([1, 2, 3], 10)
    s.apply_grow(3, [ROOT], [(want[0] + 1) % V])  # dead at the first position
    _, new = run_pass(s)  # only the last decided token is fed: the node was pending
    assert s.counts.drafts_scored == 1
    s.apply_grow(3, [0, 1, 2], want[1:4])  # below the dead node: dead on arrival
    assert not s.live and s.plan_pass() == [want[0]]
    assert s.counts.dead_skipped() == 3


def test_a_grows_reach_is_how_far_past_the_decided_end_it_drafts():
    """Anchored at the end, three drafts reach 3; after a pass decided past them, a line
    of two more at the old anchor reaches only what is not decided yet (or is behind)."""
    s = session()
    want = truth([1, 2, 3], 12)
    assert s.apply_grow(3, [ROOT, 0, 1], want[:3]) == 3
    run_pass(s)  # decides the three and a bonus: the end is 3 + 4
    assert s.end == 7
    assert s.apply_grow(3, [2, 3], want[3:5]) == 5 + 3 - 7  # positions 6 and 7: one past
    assert s.apply_grow(3, [ROOT], [want[0]]) == 3 + 1 - 7  # all behind: -3
    dead = s.next_id
    assert s.apply_grow(3, [ROOT], [(want[0] + 1) % V]) == 3 + 1 - 7  # dead, kept: the same
    assert s.apply_grow(3, [dead], [want[1]]) == 3 - 7  # below it, none kept: the anchor's


def test_impossible_grow_claims_are_invalid_arguments():
    s = session()
    with pytest.raises(InvalidArgument, match="builds on"):
        s.apply_grow(9, [ROOT], [1])  # anchored past what was decided
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        s.apply_grow(3, [ROOT], [V])


def test_random_trees_decide_the_truth_and_count_every_node_once():
    """An edge that grows random trees (drafts 70 % right, guesses at random positions), a
    verifier that passes, a link that delivers in order, interleaved at random."""
    rng = np.random.default_rng(1)
    for _trial in range(300):
        want = truth([1, 2, 3], 60)
        s = session(max_tokens=int(rng.integers(5, 40)))
        committed, downlink, sent = 3, [], 0
        leaves: list[tuple[int, int]] = []  # (node id, position) of the edge's live leaves
        while not s.done:
            if rng.random() < 0.6 and s.next_id < 400:
                if leaves and rng.random() < 0.8:
                    parent, pos = leaves[int(rng.integers(len(leaves)))]
                    pos += 1
                else:
                    parent, pos = ROOT, committed
                toks = [want[p - 3] if rng.random() < 0.7 else int(rng.integers(V))
                        for p in range(pos, pos + int(rng.integers(1, 4)))]
                first, sent = s.next_id, sent + len(toks)
                s.apply_grow(committed, [parent] + list(range(first, first + len(toks) - 1)),
                             toks)
                leaves.append((first + len(toks) - 1, pos + len(toks) - 1))
            if rng.random() < 0.5:
                downlink.append(run_pass(s))
            if downlink and rng.random() < 0.5:
                start, new = downlink.pop(0)
                assert start == committed
                committed += len(new)
                leaves = [lf for lf in leaves if lf[1] >= committed - 1 and  # dead: not kept
                          lf[0] in s.nodes and s.nodes[lf[0]].state != 2] \
                    if rng.random() < 0.5 else leaves
            check_counts(s, sent)
            assert all(s.nodes[i].state == PENDING and s.nodes[i].position >= s.end
                       for i in s.live)
        assert s.tokens[3:] == want[:len(s.tokens) - 3]


def test_grow_messages_round_trip_and_bad_parents_are_wire_errors():
    rng = np.random.default_rng(0)
    for _ in range(500):
        first, n = int(rng.integers(0, 500)), int(rng.integers(1, 9))
        parents = [int(rng.choice([-1] + list(range(first + i)))) if i == 0 or rng.random() < .5
                   else first + i - 1 for i in range(n)]
        toks = [int(t) for t in rng.integers(0, 4096, n)]
        g = decode_grow(encode_grow(7, first, toks, parents), first)
        assert (g.parents, g.tokens, g.anchor) == (parents, toks, 7)
    msg = encode_grow(3, 0, [1, 2], [-1, 0])
    msg.first_parent = 5  # five nodes back from node 0
    with pytest.raises(WireError, match="before node 0"):
        decode_grow(msg, 0)
