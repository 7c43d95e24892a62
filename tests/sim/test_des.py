"""The discrete-event model: exact on hand-computed cases, sane orderings, deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.sim.des import ModelCosts, Scenario, simulate
from acespec.sim.stages import LinkSpec

FAST = LinkSpec(1e9, 1e9, 0.0)
WAN = LinkSpec(50e3, 50e3, 0.05)
COSTS = ModelCosts(draft_s=0.001, target_base_s=0.040, target_per_node_s=0.0005)


def test_ar_exact_on_an_ideal_link():
    c = ModelCosts(target_base_s=0.01, target_per_node_s=0.0)
    r = simulate(Scenario("ar", FAST, tokens=10), c)
    # request up (an Extend's base), ten 10 ms steps, the last token down at 1 Gbit/s
    assert r.seconds == pytest.approx(0.1 + (c.up_base + c.ar_down_per_token) * 8 / 1e9,
                                      rel=1e-9)
    assert r.passes == 10


def test_sd_with_perfect_drafts_is_depth_plus_one_per_round():
    c = ModelCosts(draft_s=0.0, target_base_s=0.01, target_per_node_s=0.0)
    r = simulate(Scenario("sd", FAST, accept=1.0, depth=4, tokens=50), c)
    assert r.mean_acceptance_length == pytest.approx(5.0)
    assert r.seconds == pytest.approx(10 * 0.01, rel=1e-4)  # plus a few ns of serialisation


def test_orderings_at_50kbit_50ms():
    res = {m: simulate(Scenario(m, WAN, accept=0.8, depth=4, window=16, tokens=400, seed=1),
                       COSTS).tokens_per_s for m in ("ar", "sd", "pipeline", "acespec")}
    assert res["sd"] > res["ar"] and res["pipeline"] > res["sd"]
    assert res["acespec"] >= res["pipeline"]


def test_deterministic_per_seed_and_sensitive_to_acceptance():
    a = simulate(Scenario("pipeline", WAN, accept=0.6, seed=3), COSTS)
    assert a == simulate(Scenario("pipeline", WAN, accept=0.6, seed=3), COSTS)
    better = simulate(Scenario("pipeline", WAN, accept=0.9, seed=3), COSTS)
    assert better.tokens_per_s > a.tokens_per_s


# -- the decided engine (greedy and coupled acespec sessions) ---------------------------------

SLOW = LinkSpec(20e3, 20e3, 0.2)


def decided(link, **kw) -> Scenario:
    return Scenario("acespec", link, decided=True, **kw)


def test_decided_without_drafts_is_plain_decoding_exact():
    # window < depth: the edge never drafts, so every pass decides one continuation token
    c = ModelCosts(target_base_s=0.01, target_per_node_s=0.0)
    r = simulate(decided(FAST, depth=4, window=2, tokens=10), c)
    # Open up (an uplink message's base), the prompt's prefill, ten passes, the last
    # Decided (one token) down
    down = int(c.down_base + c.down_per_node)
    assert r.seconds == pytest.approx(c.up_base * 8 / 1e9 + 11 * 0.01 + down * 8 / 1e9,
                                      rel=1e-9)
    assert (r.rounds, r.passes, r.continuation) == (10, 11, 10)
    assert r.verifier_busy == pytest.approx(1.0, rel=1e-5)  # the link's ends: ns


def test_decided_is_deterministic_per_seed():
    a = simulate(decided(WAN, accept=0.7, seed=5), COSTS)
    assert a == simulate(decided(WAN, accept=0.7, seed=5), COSTS)
    assert a != simulate(decided(WAN, accept=0.7, seed=6), COSTS)


@pytest.mark.parametrize("depth,window", [(4, 8), (4, 16), (8, 16)])
def test_decided_perfect_drafts_on_a_fast_link(depth, window):
    c = ModelCosts(draft_s=0.0, target_base_s=0.040, target_per_node_s=0.0005)
    r = simulate(decided(FAST, accept=1.0, depth=depth, window=window, tokens=400), c)
    # Passes run back to back, so each starts before the edge hears of the one before: the
    # drafts it finds are what is left of the window, and every other pass is a bonus-only
    # one. Two passes decide window + 1 tokens; that pair is the engine's ideal.
    assert r.mean_acceptance_length <= window + 1
    assert r.mean_acceptance_length == pytest.approx((window + 1) / 2, rel=0.1)
    ideal = (window + 1) / (c.target_s(window) + c.target_s(1))
    assert ideal >= r.tokens_per_s >= 0.9 * ideal
    assert r.verifier_busy > 0.99


@pytest.mark.parametrize("link", [FAST, WAN, SLOW])
def test_decided_with_useless_drafts_is_ar_speed(link):
    ar = simulate(Scenario("ar", link, tokens=400), COSTS)
    r = simulate(decided(link, accept=0.0, tokens=400, seed=2), COSTS)
    assert r.mean_acceptance_length == 1.0
    assert r.verifier_busy > 0.97
    assert r.tokens_per_s >= 0.98 * ar.tokens_per_s  # a dead draft costs at most its node


@pytest.mark.parametrize("accept", [0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("depth,window", [(2, 2), (4, 8), (8, 16)])
def test_decided_never_slower_than_ar_at_20kbit_200ms(accept, depth, window):
    ar = simulate(Scenario("ar", SLOW, tokens=400), COSTS)
    r = simulate(decided(SLOW, accept=accept, depth=depth, window=window, tokens=400), COSTS)
    # The verifier decodes through every round trip; its extras are the prompt's prefill
    # pass (Generate's prefill yields the first token, Open's does not) and the per-node
    # cost of drafts that are fed to a pass and rejected there (under 0.5 %).
    assert r.seconds <= 1.005 * ar.seconds + COSTS.target_s(1)


def test_decided_gains_where_the_window_outruns_the_round_trip():
    ar = simulate(Scenario("ar", SLOW, tokens=400), COSTS).tokens_per_s
    r = simulate(decided(SLOW, accept=0.8, depth=8, window=16, tokens=400), COSTS)
    assert r.tokens_per_s >= 1.15 * ar
    assert r.reconciled > 0 and r.dead_skipped > 0  # late drafts were compared or dropped


@pytest.mark.parametrize("link", [FAST, WAN, SLOW])
@pytest.mark.parametrize("accept", [0.5, 0.8])
def test_decided_keeps_the_verifier_busier_than_pipeline(link, accept):
    sc = Scenario("pipeline", link, accept=accept, depth=4, window=16, tokens=300, seed=1)
    pipe = simulate(sc, COSTS)
    r = simulate(decided(link, accept=accept, depth=4, window=16, tokens=300, seed=1), COSTS)
    assert r.verifier_busy >= pipe.verifier_busy
    assert r.verifier_busy > 0.95


def test_verifier_busy_is_a_fraction_in_every_mode():
    for sc in (Scenario("ar", WAN), Scenario("sd", WAN), Scenario("pipeline", WAN),
               Scenario("acespec", WAN), decided(WAN)):
        assert 0 < simulate(sc, COSTS).verifier_busy <= 1
    assert simulate(Scenario("ar", WAN), COSTS).verifier_busy > 0.98  # only the link's ends


def test_decided_is_an_acespec_engine_only():
    with pytest.raises(ValueError, match="decided"):
        simulate(Scenario("pipeline", WAN, decided=True), COSTS)


def test_sweep_shows_the_decided_engine():
    from acespec.sim.sweep import best_per_link, sweep

    rows = sweep(COSTS, 0.8, 0.5, [50e3], [0.05], [4], tokens=100)
    assert len(rows) == 2 and all("acespec-chain" in r and "pipeline_busy" in r
                                  for r in rows)
    (best,) = best_per_link(rows)
    assert best["acespec-chain_x_ar"] > 1 and 0.9 < best["acespec-chain_busy"] <= 1


def test_the_speculation_tree_in_the_decided_engine():
    """Guessed branches (hit_rate) let the verifier walk on past a rejection: fewer tokens
    decided alone, more tokens/s than one chain, over 10 seeds."""
    def run(**kw):
        res = [simulate(Scenario("acespec", WAN, accept=0.7, depth=4, window=16, tokens=300,
                                 decided=True, seed=s, **kw), COSTS) for s in range(10)]
        return (np.mean([r.tokens_per_s for r in res]), np.mean([r.continuation for r in res]),
                sum(r.hits for r in res))
    chain = run()
    tree = run(tree=True, hit_rate=0.7, branch_depth=4)
    assert chain[2] == 0 and tree[2] > 0
    assert tree[1] < chain[1] and tree[0] > chain[0]


def test_verifier_proposals_make_lone_passes_decide_more():
    """Proposals in passes no draft covers: each lone pass decides 1 + the accepted prefix of
    4 proposals (E = 1 + a + a^2 + a^3 + a^4 = 1.9375 at a = 0.5), and the session is faster;
    without proposals a lone pass decides exactly one token."""
    plain = simulate(decided(WAN, accept=0.3, tokens=4000), COSTS)
    prop = simulate(decided(WAN, accept=0.3, tokens=4000, propose=4, propose_accept=0.5),
                    COSTS)
    assert plain.lone_passes > 100 and plain.lone_tokens == plain.lone_passes
    assert prop.lone_tokens / prop.lone_passes == pytest.approx(1.9375, rel=0.1)
    assert prop.tokens_per_s > 1.1 * plain.tokens_per_s


def test_a_gap_drafters_proposals_cost_their_decode_before_the_pass():
    """propose_s: each proposal costs its decode before the lone pass. Free proposals are
    faster than costly ones, which are faster than none while they cost less than what
    they save (here 4 x 2 ms against 40 ms passes deciding ~1.9 tokens instead of 1), and
    slower than none once they cost more (4 x 40 ms)."""
    def tps(**kw):
        return simulate(decided(WAN, accept=0.3, tokens=4000, **kw), COSTS).tokens_per_s
    none = tps()
    free = tps(propose=4, propose_accept=0.5)
    cheap = tps(propose=4, propose_accept=0.5, propose_s=0.002)
    dear = tps(propose=4, propose_accept=0.5, propose_s=0.040)
    assert free > cheap > 1.1 * none > dear


def test_the_sweep_has_the_gap_drafter_mode():
    from acespec.sim.sweep import best_per_link, sweep

    rows = sweep(COSTS, 0.7, 0.5, [50_000], [0.1], [4], tokens=300)
    best = best_per_link(rows)[0]
    assert best["acespec-gap"] > best["acespec"] and "acespec-gap_busy" in best


def test_the_sweep_scores_prompt_lookup_in_lone_passes():
    """lookup_accept: the decided modes' lone passes score the verifier's prompt-lookup
    proposals: faster than without, the lone share reported per decided mode, and the
    acceptance fitted to a run's tokens per lone pass gives that many back in the model."""
    from acespec.sim.calibrate import lookup_acceptance
    from acespec.sim.sweep import GAP_PROPOSE, best_per_link, sweep

    plain = best_per_link(sweep(COSTS, 0.6, 0.5, [50_000], [0.1], [4], tokens=300))[0]
    looked = best_per_link(sweep(COSTS, 0.6, 0.5, [50_000], [0.1], [4], tokens=300,
                                 lookup_accept=0.5))[0]
    for mode in ("acespec-chain", "acespec"):
        assert looked[mode] > 1.2 * plain[mode]
        assert 0.5 < plain[f"{mode}_lone"] <= 1 and 0 < looked[f"{mode}_lone"] <= 1
    assert looked["acespec-gap"] == plain["acespec-gap"]  # its proposals are the gap drafter's
    a = lookup_acceptance(2.0, GAP_PROPOSE)
    assert a == pytest.approx(0.5, abs=0.01)
    assert lookup_acceptance(1.0, GAP_PROPOSE) == lookup_acceptance(3.0, 0) == 0.0
    res = simulate(decided(WAN, accept=0.3, tokens=4000, propose=GAP_PROPOSE,
                           propose_accept=a), COSTS)
    assert res.lone_tokens / res.lone_passes == pytest.approx(2.0, rel=0.1)


def test_a_verifier_that_holds_for_drafts_on_their_way():
    """hold_s (an analysis knob; the real verifier never waits): a verifier that idles for
    drafts already on their way runs fewer lone passes, yet at 50 kbit/s / 50 ms with
    prompt lookup deciding ~2 tokens per lone pass it decides fewer tokens per second, and
    even an unbounded hold leaves lone passes above 30 % (over 8 seeds)."""
    def run(hold_s):
        res = [simulate(decided(WAN, accept=0.74, depth=16, window=32, tokens=400, tree=True,
                                hit_rate=1.0, branch_depth=4, propose=8, propose_accept=0.57,
                                hold_s=hold_s, seed=s), COSTS) for s in range(8)]
        return (np.mean([r.tokens_per_s for r in res]),
                sum(r.lone_passes for r in res) / sum(r.rounds for r in res))
    (never, never_lone), (held, held_lone) = run(0.0), run(10.0)
    assert held_lone < never_lone - 0.05 and held_lone > 0.3
    assert held < 0.95 * never
