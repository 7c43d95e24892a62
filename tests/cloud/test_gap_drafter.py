"""The verifier's gap drafter (acespec.cloud.verify.gap): a GGUF drafter dequantized for torch that
proposes in lone passes. Its greedy proposals are the model's own greedy tokens, whatever the
session's cache held before; a drafter with another tokenizer is refused naming both; and
proposals, right or wrong, never change the decided text (greedy and coupled)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_decided_proposals import COUPLED, GREEDY, V, _decode, hashed, periodic  # noqa: E402

from acespec.cloud.verify.engine import Engine, Limits, _agreeing  # noqa: E402
from acespec.cloud.verify.gap import DECAY, EXPLORE, WARMUP, GapDrafter, Ledger  # noqa: E402
from acespec.cloud.verify.proposals import PassCost  # noqa: E402
from acespec.models import DEMO_TARGET  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from conftest import plain_greedy  # noqa: E402
from test_decided import grow_chain  # noqa: E402
from verifier_harness import run  # noqa: E402


@pytest.fixture
def gap(tiny_pair):
    """The f32 copy of the tiny target, its linears as the target's here (torch's F.linear:
    the fixture's target is built in-process, unpacked), so its picks are the target's to
    the last bit — as `cloud serve` loads both with the same `--linear`."""
    tok_dir, model, ggufs = tiny_pair
    return GapDrafter.load(ggufs["f32"], Tokenizer.load(tok_dir).vocab_hash(),
                           model.args.vocab_size, linear="torch")


def flat_cost():
    """A pass cost where every pass costs the same, so a busy machine's timings cannot make
    a proposal look not worth its pass (the depth would then skip the ledger's turn)."""
    class Flat(PassCost):
        def seconds(self, tokens: int) -> float:
            return 0.01

    return Flat()


def decide(model, vocab: str, prompt: list[int], params, seed: int, max_tokens: int, *,
           propose: int = 1, gap=None, sharing: float | None = None):
    """One decided session run to its end on an Engine whose passes all cost the same
    (flat_cost), `sharing` sessions on its device when scripted; returns the session."""

    async def go():
        eng = Engine(model, vocab, "t", Limits(propose=propose), gap=gap)
        eng.depth.cost = flat_cost()
        if sharing is not None:
            eng.sharing = lambda: sharing
        _, s, _ = await eng.open_decided(prompt, params, seed, max_tokens, [])
        while not s.done:
            await eng.decided_pass(s)
        return s

    return run(go())


def test_proposals_are_the_models_greedy_tokens_as_the_text_grows(gap, tiny_pair):
    """The f32 GGUF of the tiny target, proposing after a text that grows by what was
    decided (some of its own proposals, some not): each call equals greedy decoding of
    the original torch model from scratch, so the kept cache is right."""
    _, model, _ = tiny_pair
    rng = np.random.default_rng(0)
    text = [int(t) for t in rng.integers(3, model.args.vocab_size, 12)]
    state = gap.open()
    for step in range(12):
        got = gap.propose(state, text, 4)
        assert got == plain_greedy(model, text, 4), step
        take = int(rng.integers(0, 5))  # the walk took this many, then decided one more
        text += got[:take] + [int(rng.integers(3, model.args.vocab_size))]
    assert state.fed == len(text) - 1 - take


def test_proposals_stop_at_the_drafters_context(gap):
    state = gap.open()
    n = gap.model.args.max_position_embeddings
    assert len(gap.propose(state, [5] * (n - 2), 4)) == 2
    assert gap.propose(state, [5] * n, 4) == []


def test_a_drafter_with_another_tokenizer_is_refused(tiny_pair):
    _, _, ggufs = tiny_pair
    demo = Tokenizer.load(DEMO_TARGET)
    with pytest.raises(ValueError, match="--gap-drafter.*not the target's.*share the target's"):
        GapDrafter.load(ggufs["q8_0"], demo.vocab_hash(), 4096)
    with pytest.raises(FileNotFoundError, match="--gap-drafter"):
        GapDrafter.load("/nonexistent/drafter.gguf", demo.vocab_hash(), 4096)


def _gap_like(logits, p_right: float, seed: int):
    """A stand-in gap drafter: the target's greedy token with probability p_right, else a
    random one, chained on its own guesses."""
    rng = np.random.default_rng(seed)

    def propose(text: list[int], k: int) -> list[int]:
        out: list[int] = []
        for _ in range(k):
            right = int(np.argmax(logits(text + out)))
            out.append(right if rng.random() < p_right else int(rng.integers(0, V)))
        return out
    return propose


@pytest.mark.parametrize("params", [GREEDY, COUPLED], ids=["greedy", "coupled"])
@pytest.mark.parametrize("logits", [periodic, hashed])
def test_gap_proposals_never_change_the_decided_text(params, logits):
    """30 random sessions each (the edge sends random drafts, some right, between passes):
    the decided text with a gap drafter's proposals (right 60 % of the time) equals the text
    with none; greedily, some are accepted."""
    accepted = 0
    for trial in range(30):
        plain = _decode(params, logits, 0, np.random.default_rng(trial))
        gapped = _decode(params, logits, 4, np.random.default_rng(trial),
                         proposer=_gap_like(logits, 0.6, trial))
        assert gapped.tokens == plain.tokens, trial
        assert gapped.counts.proposed > 0
        accepted += gapped.counts.proposed_accepted
    if params is GREEDY:
        assert accepted > 0


def test_an_engine_session_proposes_with_the_gap_drafter_only_when_asked(gap, tiny_pair):
    """Engine.open_decided(gap=...) gives the session the drafter's state or none; with
    none, a lone pass is left to prompt lookup (up to DecideLimits.propose tokens)."""

    tok_dir, model, _ = tiny_pair

    async def go():
        eng = Engine(model, Tokenizer.load(tok_dir).vocab_hash(), "t", Limits(propose=4),
                     gap=gap)
        out = {}
        for on in (True, False):
            _, s, _ = await eng.open_decided([1, 5, 9, 14], GREEDY, 0, 12, [], gap=on)
            while not s.done:
                await eng.decided_pass(s)
            out[on] = s
        return out

    s = run(go())
    assert s[True].tokens == s[False].tokens == [1, 5, 9, 14] + plain_greedy(model, [1, 5, 9, 14], 12)
    assert s[True].counts.gap_s > 0 and s[True].counts.proposed > 0
    assert s[True].counts.passes < s[False].counts.passes  # its own greedy tokens: all taken
    assert s[False].counts.gap_s == 0 and s[False].gap is None


def test_a_drafter_that_has_spent_more_than_it_earned_is_asked_rarely(gap, tiny_pair):
    """A ledger deep in the red (100 s spent, nothing earned) stays there over a session:
    the drafter is asked in one lone pass of EXPLORE, prompt lookup proposes in the others,
    and the text is the target's greedy text either way."""

    tok_dir, model, _ = tiny_pair
    gap.ledger = Ledger(calls=WARMUP, spent_s=100.0)
    prompt = [1, 5, 9, 14]
    # Every pass costs the same, so one proposal always pays: only the ledger decides.
    s = decide(model, Tokenizer.load(tok_dir).vocab_hash(), prompt, GREEDY, 0, 60, gap=gap)
    assert s.tokens == prompt + plain_greedy(model, prompt, 60)
    lone = s.counts.lone_passes
    assert lone > 20 and s.gap.calls == lone // EXPLORE
    assert gap.ledger.calls == WARMUP + s.gap.calls and gap.ledger.spent_s > 50


def test_the_ledger_asks_while_earned_covers_spent():
    book = Ledger()
    for _ in range(WARMUP):  # warm-up: asked whatever it costs
        assert book.worth()
        book.settle(accepted=0, baseline=0, pass_s=0.040, spent_s=1.0)
    asked = [book.worth() for _ in range(2 * EXPLORE)]
    assert asked.count(True) == 2 and asked[EXPLORE - 1] and asked[-1]
    book = Ledger(calls=WARMUP)
    book.settle(accepted=3, baseline=1, pass_s=0.040, spent_s=0.070)  # 80 ms earned
    assert book.worth()
    book.settle(accepted=1, baseline=1, pass_s=0.040, spent_s=0.020)  # lookup had it too
    assert not book.worth()
    assert book.earned_s == pytest.approx(DECAY * 0.080)
    assert book.spent_s == pytest.approx(DECAY * 0.070 + 0.020)


def test_the_ledger_charges_a_draft_step_to_every_session_that_waits_it_out():
    """Hybrid drafting: a drafter that earns five times what it spends is asked in every
    lone pass while the device serves one session, and stops as the device fills (the
    draft step delays each session sharing it): past 5 sessions it explores once in
    EXPLORE x sessions lone passes, so exploring costs the same per session under load."""

    book = Ledger(calls=WARMUP, earned_s=0.5, spent_s=0.1)
    assert all(book.worth(1.0) for _ in range(50))
    assert all(book.worth(4.9) for _ in range(50))
    for sharing in (6.0, 16.0):
        book = Ledger(calls=WARMUP, earned_s=0.5, spent_s=0.1)
        asked = [book.worth(sharing) for _ in range(int(4 * EXPLORE * sharing))]
        assert asked.count(True) == 4, sharing
    assert Ledger(calls=WARMUP, earned_s=0.5, spent_s=0.1).worth(0.3)  # never below one
    assert Ledger(calls=WARMUP - 1, spent_s=100.0).worth(64.0)  # warm-up: asked regardless


def test_a_loaded_verifier_stops_drafting_for_its_sessions(gap, tiny_pair):
    """The same session on an idle and on a full device (the load scripted: 12 sessions
    sharing each pass): the drafter, paying its way, proposes in each lone pass of the
    first and in a few of the second's (prompt lookup in the rest), and both texts are the
    target's greedy text."""

    tok_dir, model, _ = tiny_pair
    prompt = [1, 5, 9, 14]
    timed = gap._time_step
    gap._time_step = lambda seconds: timed(0.001)  # each draft step 1 ms, a tenth of a pass

    def on(sharing: float):
        gap.ledger = Ledger(calls=WARMUP, earned_s=5.0, spent_s=1.0)  # pays 5x, idle
        return decide(model, Tokenizer.load(tok_dir).vocab_hash(), prompt, GREEDY, 0, 60,
                      gap=gap, sharing=sharing)

    idle, full = on(1.0), on(12.0)
    assert idle.tokens == full.tokens == prompt + plain_greedy(model, prompt, 60)
    assert idle.gap.calls >= idle.counts.lone_passes - 1 > 20  # the last has no room left
    assert full.gap.calls <= full.counts.lone_passes // (EXPLORE * 12) + 1
    assert full.counts.lone_passes > idle.counts.lone_passes  # its proposals were missed


def test_lookups_counterfactual_is_its_prefix_agreeing_with_what_was_decided():
    assert _agreeing([4, 5, 6], [4, 5, 9]) == 2
    assert _agreeing([4, 5], [4, 5, 6]) == 2
    assert _agreeing([4, 5, 6], [4]) == 1  # beyond what the pass decided: not counted
    assert _agreeing([], [4]) == 0 and _agreeing([7], [4]) == 0


def test_coupled_sessions_get_the_drafters_coupled_picks(gap, tiny_pair):
    """In a coupled session the drafter proposes its Gumbel-max with the target's noise at
    each position (the session's own verdict rule), not its greedy token: the f32 copy of
    the target then proposes what the target decides, so nearly every proposal scored is
    taken, far more often than the greedy token is the decided one; and the text is the one
    the session decides with no proposals at all. (Not every one: the copy proposes one
    token per forward, the target scores several per pass, and float32 sums in another
    order can flip a near tie of the Gumbel-max; CI saw 16 of 18.)"""

    tok_dir, model, _ = tiny_pair
    vocab, prompt = Tokenizer.load(tok_dir).vocab_hash(), [1, 5, 9, 14]
    gap._time_step = lambda seconds: None  # steps counted free: the depth asks for them all
    gap.ledger = Ledger(calls=WARMUP, earned_s=1e6)  # and the ledger asks in every lone pass
    plain = decide(model, vocab, prompt, COUPLED, 7, 30, propose=0)
    s = decide(model, vocab, prompt, COUPLED, 7, 30, propose=4, gap=gap)
    assert s.tokens == plain.tokens
    assert s.counts.gap_s > 0 and s.counts.proposed > 0
    taken = s.counts.proposed_accepted / s.counts.proposed
    decided = range(len(prompt), len(s.tokens))
    greedy = np.mean([plain_greedy(model, s.tokens[:p], 1)[0] == s.tokens[p] for p in decided])
    assert taken >= 0.8 and taken > greedy + 0.3, (vars(s.counts), greedy)
    assert s.counts.passes < plain.counts.passes


def test_the_drafter_waits_while_the_edges_drafts_continue_the_text(gap, tiny_pair):
    """Hybrid drafting, one session: while the edge's latest draft was right (its drafts in
    flight continue the decided text) a lone pass leaves proposals to prompt lookup; after
    a miss, until the edge's drafts from the recovered token arrive, the drafter proposes;
    and the text is the target's greedy text."""

    tok_dir, model, _ = tiny_pair
    prompt = [1, 5, 9, 14]
    greedy = plain_greedy(model, prompt, 40)
    gap.ledger = Ledger(calls=WARMUP, earned_s=5.0, spent_s=1.0)  # it pays: only sync decides

    async def go():
        eng = Engine(model, Tokenizer.load(tok_dir).vocab_hash(), "t", Limits(propose=4),
                     gap=gap)
        eng.depth.cost = flat_cost()
        _, s, _ = await eng.open_decided(prompt, GREEDY, 0, 40, [])
        assert not s.edge_on_path()  # no draft yet
        grow_chain(s, greedy[1:5])  # right: all taken, plus the bonus
        await eng.decided_pass(s)
        assert s.edge_on_path() and s.gap.calls == 0
        await eng.decided_pass(s)  # lone, ahead of the edge: lookup's
        calls = [s.gap.calls]
        wrong = (greedy[len(s.tokens) - len(prompt)] + 1) % model.args.vocab_size
        grow_chain(s, [wrong])  # a miss
        await eng.decided_pass(s)
        assert not s.edge_on_path()
        await eng.decided_pass(s)  # lone, in the round trip after the miss: the drafter's
        calls.append(s.gap.calls)
        grow_chain(s, greedy[len(s.tokens) - len(prompt):][:3])  # back in step
        await eng.decided_pass(s)
        await eng.decided_pass(s)
        calls.append(s.gap.calls)
        while not s.done:
            await eng.decided_pass(s)
        return s, calls

    s, calls = run(go())
    assert calls == [0, 1, 1]
    assert s.tokens == prompt + greedy


def test_an_edge_draft_that_brings_a_proposed_token_takes_back_its_credit(gap, tiny_pair):
    """The ledger credits a pass (here scripted at 5 s) for each token the drafter's
    proposals decided beyond lookup's; when the edge's drafts for those positions arrive
    moments later, the proposals saved only those moments, and the next pass hands the rest
    back to the ledger at once."""

    class Slow(PassCost):
        def seconds(self, tokens: int) -> float:
            return 5.0

    tok_dir, model, _ = tiny_pair
    prompt = [1, 5, 9, 14]
    greedy = plain_greedy(model, prompt, 30)
    gap.ledger = Ledger(calls=WARMUP, earned_s=50.0, spent_s=1.0)

    async def go():
        eng = Engine(model, Tokenizer.load(tok_dir).vocab_hash(), "t", Limits(propose=4),
                     gap=gap)
        eng.depth.cost, eng.batcher.cost = flat_cost(), Slow()
        _, s, _ = await eng.open_decided(prompt, GREEDY, 0, 30, [])
        await eng.decided_pass(s)  # lone, no edge yet: the drafter's, all taken
        credited, earned = dict(s.gap.credited), gap.ledger.earned_s
        assert credited
        grow_chain(s, greedy[1:len(s.tokens) - len(prompt)], anchor=len(prompt) + 1)
        refund = earned - gap.ledger.earned_s
        assert 4.0 * len(credited) < refund <= 5.0 * len(credited) and not s.gap.credited
        calls = s.gap.calls
        await eng.decided_pass(s)  # the edge is on the path: no call
        assert s.gap.calls == calls
        return s

    s = run(go())
    assert s.tokens[:len(prompt) + 5] == (prompt + greedy)[:len(prompt) + 5]
