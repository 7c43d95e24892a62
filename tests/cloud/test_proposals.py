"""How many proposals a lone pass scores (acespec.cloud.verify.proposals): the pass-cost line, the
conditional acceptance by order and depth, and the real engine scoring fewer proposals
where a node costs more, with the text unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.cloud.verify.proposals import EXPLORE, ORDERS, SIZE_SEEN, Depth, PassCost, worth_depth
from acespec.shared.served import ServeParams
from acespec.shared.tokenizer import Tokenizer

GREEDY = ServeParams()


def _walked(d: Depth, accept: float) -> Depth:
    """d after 400 lone passes of 8 order-1 proposals, each taken in turn with probability
    `accept` (seed 0)."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        taken = 0
        while taken < 8 and rng.random() < accept:
            taken += 1
        d.settle(1, proposed=8, accepted=taken)
    return d


def test_the_pass_cost_line_recovers_base_and_node_cost():
    """Passes of 1-9 tokens costing 40 ms + 0.5 ms per token + up to 2 ms of noise (seed 0):
    the base within 2 ms, the node cost within 0.2 ms."""
    cost, rng = PassCost(), np.random.default_rng(0)
    for _ in range(64):
        n = int(rng.integers(1, 10))
        cost.observe(n, 0.040 + 0.0005 * n + rng.uniform(0, 0.002))
    base, per_node = cost.fit()
    assert abs(base - 0.041) < 0.002 and abs(per_node - 0.0005) < 0.0002, (base, per_node)


def test_passes_of_one_size_read_no_node_cost():
    cost = PassCost()
    for _ in range(16):
        cost.observe(5, 0.03)
    assert cost.fit() == (pytest.approx(0.03), 0.0)


def test_a_size_timed_often_enough_reads_its_own_median():
    """Passes of 1, 2 and 4 tokens costing 66, 107 and 95 ms (a float32 SmolLM2 pass on MKL's
    slow 2-row path, as in docs/benchmarks.md §5), 4 of each: each size reads its median,
    while a size never timed (3) reads the line through them all, which is far from the step
    at 2."""
    cost = PassCost()
    for i in range(4):
        for n, ms in ((1, 66), (2, 107), (4, 95)):
            cost.observe(n, ms / 1000 + 0.001 * (i % 2))
    assert [round(cost.seconds(n) * 1000) for n in (1, 2, 4)] == [66, 108, 96]
    base, per_token = cost.fit()
    assert cost.seconds(3) == pytest.approx(base + 3 * per_token)
    assert cost.seconds(2) - cost.seconds(1) > 3 * per_token


def test_the_depth_reads_a_step_in_the_pass_cost():
    """On the step above (a 2-token pass 1.6x a lone one, flat after): proposals taken 30 %
    of the time are not worth one (1.3 tokens in 107 ms < 1 in 66), nor a run of them (the
    line would have taken them: its slope is a few ms); taken 90 % of the time all 8 are."""
    def depth(accept: float) -> int:
        d = Depth(8)
        for _ in range(SIZE_SEEN):
            for n, ms in ((1, 66), (2, 107), (3, 110), (4, 95), (5, 98), (6, 100), (7, 103),
                          (8, 106), (9, 110)):
                d.cost.observe(n, ms / 1000)
        return _walked(d, accept).depth(1, 8)

    assert depth(0.3) == 0
    assert depth(0.9) == 8
    assert worth_depth([0.3] * 8, lambda n: 0.066 + 0.004 * (n - 1)) > 0  # what the line did


def test_a_draft_step_per_proposal_makes_the_depth_shallower():
    """A gap drafter's proposal costs a draft step besides its node: on a flat 25 ms pass
    with each proposal taken 60 % of the time, free proposals are scored 8 deep; at 5 ms a
    step (a sixth of a pass), 2 (1.96 tokens in 35 ms beats 1.6 in 30 and 2.18 in 40); at
    40 ms, under load (5 ms times 8 sessions sharing the device), none."""
    flat = lambda n: 0.025  # noqa: E731
    assert worth_depth([0.6] * 8, flat) == 8
    assert worth_depth([0.6] * 8, flat, extra_s=0.005) == 2
    assert worth_depth([0.6] * 8, flat, extra_s=0.040) == 0


def test_settle_counts_what_the_walk_reached_and_took():
    """Four proposals of order 2, the walk took two: depths 0-2 were reached, 0-1 taken; a
    longer lookup match (order 7) counts in the last bucket."""
    d = Depth(8)
    d.settle(2, proposed=4, accepted=2)
    got = [d.rate(2, i) for i in range(4)]
    assert got == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 2], rel=0.01)
    d.settle(7, proposed=1, accepted=1)
    assert d.rate(ORDERS - 1, 0) == pytest.approx(2 / 3, rel=0.01)


def test_the_depth_follows_acceptance_and_node_cost():
    """On a 40 ms pass: proposals always taken, or each taken with probability 0.7 (seed 0),
    are worth all 8 of the room at 0.5 ms a node; never taken, none is; at 20 ms a node,
    two of the 0.7 ones: 1 + 0.7 + 0.49 tokens in 100 ms beats 1.7 in 80 and 2.53 in 120."""
    def depth(accept: float, per_node_s: float) -> int:
        d = Depth(8)
        for n in range(1, 17):  # the cost line: passes of 1..16 tokens
            d.cost.observe(n, 0.040 + per_node_s * n)
        return _walked(d, accept).depth(1, 8)

    assert depth(1.0, 0.0005) == 8
    assert depth(0.0, 0.0005) == 0
    assert depth(0.7, 0.0005) == 8
    assert depth(0.7, 0.020) == 2


def test_an_order_not_worth_a_proposal_still_gets_one_in_explore():
    """Never taken: depth 0, except one proposal in every EXPLORE lone passes."""
    d = Depth(8)
    for _ in range(100):
        d.settle(1, proposed=1, accepted=0)
    got = [d.depth(1, 8) for _ in range(3 * EXPLORE)]
    assert got.count(1) == 3 and set(got) == {0, 1} and got[EXPLORE - 1] == 1


@pytest.mark.slow
def test_the_engine_scores_fewer_proposals_where_a_node_costs_more():
    """The real engine (the demo target, a code prompt, greedy decided sessions) under
    two step profiles: 40 ms + 0.5 ms per node, and 10 ms + 6 ms per node. Its proposals per
    lone pass fall where a node costs more; the text is the target's greedy text in both and
    with no proposals at all (propose 0)."""
    from acespec.cloud.target.loader import load_model
    from acespec.cloud.verify.batcher import StepEmulation
    from acespec.cloud.verify.engine import Engine, Limits
    from acespec.models import DEMO_TARGET

    from verifier_harness import run

    model, tok = load_model(DEMO_TARGET), Tokenizer.load(DEMO_TARGET)
    vocab = tok.vocab_hash()
    prompt = tok.encode("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n")

    async def go(propose: int, base_ms: float, node_ms: float):
        eng = Engine(model, vocab, "t", Limits(propose=propose),
                     emulation=StepEmulation(base_ms, node_ms))
        sessions = []
        for _ in range(3):  # the engine's statistics carry over from session to session
            _, s, _ = await eng.open_decided(prompt, GREEDY, 0, 40, [])
            while not s.done:
                await eng.decided_pass(s)
            sessions.append(s)
        return sessions

    plain = run(go(0, 0.0, 0.0))
    cheap = run(go(8, 40.0, 0.5))
    dear = run(go(8, 10.0, 6.0))
    for runs in (cheap, dear):
        assert [s.tokens for s in runs] == [s.tokens for s in plain]

    def per_lone(runs) -> float:
        c = [s.counts for s in runs]
        return sum(x.proposed for x in c) / max(1, sum(x.lone_passes for x in c))

    print("proposals per lone pass: cheap", per_lone(cheap), "dear", per_lone(dear))
    assert per_lone(cheap) > 1.5 * per_lone(dear)
    assert sum(s.counts.passes for s in cheap) < sum(s.counts.passes for s in plain)


def test_a_sizes_median_follows_each_new_pass_of_that_size():
    cost = PassCost()
    for s in (0.010, 0.030, 0.020):
        cost.observe(4, s)
    assert cost.seconds(4) == pytest.approx(0.020)  # asked again: the same, kept
    assert cost.seconds(4) == pytest.approx(0.020)
    cost.observe(6, 0.5)  # another size leaves it be
    assert cost.seconds(4) == pytest.approx(0.020)
    cost.observe(4, 0.040)
    cost.observe(4, 0.050)
    assert cost.seconds(4) == pytest.approx(0.030)  # the median of the five
