"""The verifier's own proposals (DecideLimits.propose): a pass no draft covers scores what
prompt lookup proposes. Verdicts stay a function of (seed, position, p~), so the decided text
is the same with proposals as without, under greedy and coupled sampling, whatever the edge
sends; a text that repeats itself is decided several tokens per lone pass."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from acespec.cloud.verify.decided import ROOT, DecidedSession, DecideLimits
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams

V = 40
GREEDY = ServeParams()
COUPLED = ServeParams(SamplingParams(temperature=0.8, coupled=True))


def _rows(inputs: list[int], ctx: list[int], logits) -> np.ndarray:
    """Logits rows [1 + n, V] of a pass: each input's row from its own path's context."""
    return np.stack([logits(ctx := ctx + [t]) for t in inputs])


def _pass(s: DecidedSession, logits, proposer=None):
    """Run one pass of `s` against the toy target `logits(context) -> [V]`: each fed node's
    row comes from the decided text plus the path to it. proposer(text, k): a gap drafter's
    proposals in a lone pass instead of prompt lookup."""
    inputs = s.plan_pass(lookup_proposals=proposer is None)
    if s.proposal_room:
        s.add_proposals(proposer(list(s.tokens), s.proposal_room))
        inputs = s.pass_tokens()
    base = s.tokens[:-1]
    rows, prefix = [logits(base + [inputs[0]])], {}
    for i, nid in enumerate(s._in_pass):  # the nodes fed, parents first
        node = s.nodes[nid]
        up = prefix.get(node.parent, [])
        prefix[nid] = up + [node.token]
        rows.append(logits(s.tokens + prefix[nid]))
        assert inputs[1 + i] == node.token
    return s.finish_pass(np.stack(rows), 0.01)


def periodic(context: list[int]) -> np.ndarray:
    """A target that repeats its text with period 5 (prompt lookup's best case)."""
    row = np.full(V, -5.0, np.float32)
    row[context[-5] if len(context) >= 5 else 0] = 5.0
    return row


def hashed(context: list[int]) -> np.ndarray:
    """A target whose distribution is a pseudo-random function of the last 3 tokens (text
    repeats sometimes, often not), spread enough for coupled sampling to vary."""
    rng = np.random.default_rng(zlib.crc32(bytes(np.asarray(context[-3:], np.uint8))))
    return rng.normal(0, 2.0, V).astype(np.float32)


def _decode(params, logits, propose: int, rng: np.random.Generator | None, n: int = 48,
            proposer=None):
    """Decide n tokens; with rng, an edge sends random drafts (some right) between passes."""
    s = DecidedSession([1, 2, 3, 4, 5, 1, 2], params, 7,
                       DecideLimits(max_tokens=n, propose=propose))
    while not s.done:
        if rng is not None and rng.random() < 0.4:
            toks = [int(t) for t in rng.integers(0, V, int(rng.integers(1, 4)))]
            if rng.random() < 0.5:  # sometimes right: what the target would say greedily
                toks = [int(np.argmax(logits(s.tokens)))] + toks[1:]
            s.apply_grow(s.end, [ROOT] + list(range(s.next_id, s.next_id + len(toks) - 1)),
                         toks)
        _pass(s, logits, proposer)
    return s


@pytest.mark.parametrize("params", [GREEDY, COUPLED], ids=["greedy", "coupled"])
@pytest.mark.parametrize("logits", [periodic, hashed])
def test_proposals_never_change_the_decided_text(params, logits):
    for trial in range(30):
        plain = _decode(params, logits, 0, np.random.default_rng(trial))
        proposed = _decode(params, logits, 4, np.random.default_rng(trial))
        assert proposed.tokens == plain.tokens, trial
        assert plain.counts.proposed == 0


def test_a_repeating_text_is_decided_several_tokens_per_lone_pass():
    plain = _decode(GREEDY, periodic, 0, None)
    proposed = _decode(GREEDY, periodic, 4, None)
    assert proposed.tokens == plain.tokens
    c = proposed.counts
    assert plain.counts.passes == 48 and plain.counts.lone_tokens == 48  # one token a pass
    # Each lone pass: 4 proposals accepted + the bonus; the first pass has no history yet.
    assert c.passes <= 48 // 5 + 2 and c.lone_tokens == 48
    # every decided token but each pass's last (the bonus) was a proposal the walk took
    assert c.proposed_accepted >= 48 - c.passes - 1 and c.proposed_accepted <= c.proposed
    assert c.drafts_scored == 0 and c.dead_skipped() == 0  # proposals are not edge drafts


def test_a_pass_with_a_draft_at_the_decided_end_proposes_nothing():
    s = DecidedSession([1, 2, 3, 4, 5, 1, 2], GREEDY, 0, DecideLimits(max_tokens=8, propose=4))
    s.apply_grow(s.end, [ROOT], [3])
    _pass(s, periodic)
    assert s.counts.proposed == 0 and s.counts.lone_passes == 0 and s.counts.drafts_scored == 1
    assert not [n for n in s.nodes if n < ROOT]  # no proposal is left behind
