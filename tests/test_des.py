"""The discrete-event model: exact on hand-computed cases, sane orderings, deterministic."""

from __future__ import annotations

import pytest

from acespec.sim.des import Costs, Scenario, simulate
from acespec.sim.stages import LinkSpec

FAST = LinkSpec(1e9, 1e9, 0.0)
WAN = LinkSpec(50e3, 50e3, 0.05)
COSTS = Costs(draft_s=0.001, target_base_s=0.040, target_per_node_s=0.0005)


def test_ar_exact_on_an_ideal_link():
    c = Costs(target_base_s=0.01, target_per_node_s=0.0)
    r = simulate(Scenario("ar", FAST, tokens=10), c)
    # request up (20 B), ten 10 ms steps, the last token down (18 B) at 1 Gbit/s
    assert r.seconds == pytest.approx(0.1 + 20 * 8 / 1e9 + 18 * 8 / 1e9, rel=1e-9)
    assert r.target_forwards == 10


def test_sd_with_perfect_drafts_is_depth_plus_one_per_round():
    c = Costs(draft_s=0.0, target_base_s=0.01, target_per_node_s=0.0)
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
