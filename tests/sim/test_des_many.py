"""The discrete-event model with many sessions on one verifier (acespec.sim.des_many):
passes shared by every ready session, a flat-then-linear step, a co-located drafter's steps
on the device. Deterministic for a seed; no timing."""

from __future__ import annotations

import pytest

from acespec.cloud.verify.pressure import Pressure
from acespec.sim.des import ModelCosts
from acespec.sim.des_many import Fleet, proposals, simulate_many
from acespec.sim.stages import LinkSpec

LINK = LinkSpec(50_000, 50_000, 0.05)
GPU_LIKE = ModelCosts(target_base_s=0.025, target_per_node_s=0.0001, target_knee=256)


def test_below_the_knee_a_shared_pass_costs_each_client_nothing():
    """ar: one token per pass, a pass of N nodes costs what one does below the knee, so the
    per-client rate holds and the aggregate grows N-fold."""
    one = simulate_many("ar", 1, LINK, Fleet(), GPU_LIKE)
    many = simulate_many("ar", 16, LINK, Fleet(), GPU_LIKE)
    assert many["per_client_tok_s_p50"] == pytest.approx(one["per_client_tok_s_p50"], rel=0.02)
    assert many["aggregate_tok_s"] == pytest.approx(16 * one["aggregate_tok_s"], rel=0.02)
    assert one["nodes_per_token"] == 1.0 and one["verifier_busy"] > 0.9


def test_past_the_knee_every_client_slows():
    costs = ModelCosts(target_base_s=0.025, target_per_node_s=0.001, target_knee=8)
    rates = [simulate_many("ar", n, LINK, Fleet(), costs)["per_client_tok_s_p50"]
             for n in (8, 16, 32)]
    assert rates[0] > rates[1] > rates[2]
    assert rates[2] == pytest.approx(rates[0] * 0.025 / (0.025 + 0.001 * 24), rel=0.05)


def test_edge_drafts_and_proposals_decide_more_than_one_token_a_pass():
    fleet = Fleet(accept=0.8, lookup_accept=0.3)
    ar = simulate_many("ar", 4, LINK, fleet, GPU_LIKE)
    for mode in ("acespec", "colo", "cloud-lookup"):
        r = simulate_many(mode, 4, LINK, fleet, GPU_LIKE)
        assert r["per_client_tok_s_p50"] > 1.3 * ar["per_client_tok_s_p50"], mode
    assert simulate_many("acespec", 4, LINK, fleet, GPU_LIKE) == \
        simulate_many("acespec", 4, LINK, fleet, GPU_LIKE)  # seeded: the same run


def test_a_colocated_drafter_stands_down_where_its_steps_would_hold_every_client():
    """colo's draft steps run on the device before each pass: the dearer they are per
    session, the slower its one client; with 32 clients sharing the device, steps that
    would hold every session do not pay (proposals), so the drafter stands down for prompt
    lookup instead of slowing every client (as a drafter that always drafts would, to
    under half the rate)."""
    cheap = Fleet(accept=0.8, draft_base_s=0.005, draft_per_seq_s=0.0)
    dear = Fleet(accept=0.8, draft_base_s=0.005, draft_per_seq_s=0.002)
    ratio = {}
    for n in (1, 32):
        a = simulate_many("colo", n, LINK, cheap, GPU_LIKE)["per_client_tok_s_p50"]
        b = simulate_many("colo", n, LINK, dear, GPU_LIKE)["per_client_tok_s_p50"]
        ratio[n] = b / a
    assert ratio[1] < 1 and ratio[32] > 0.75, ratio


def test_a_full_device_scores_only_the_proposals_that_pay():
    """Load-aware speculation, as the verifier's: idle, a lone pass scores as many of its
    proposals as pay for it alone; past the knee and full of sessions, only those that pay
    for the pass every session shares, so each token costs fewer nodes; a co-located
    drafter that does not pay stands down for prompt lookup."""
    steep = ModelCosts(target_base_s=0.025, target_per_node_s=0.001, target_knee=8)
    fleet = Fleet(accept=0.8, lookup_accept=0.6)
    idle, full = Pressure(), Pressure(nodes=64, sessions=32, tokens=1.5)
    for mode in ("cloud-lookup", "colo"):
        busy, alone = proposals(mode, fleet, steep, full), proposals(mode, fleet, steep, idle)
        assert busy.depth < alone.depth, mode
    # colo: idle, the drafter beside the target proposes; on a full device its steps would
    # hold every session, so prompt lookup's free proposals are scored instead
    drafter = proposals("colo", fleet, steep, idle)
    assert drafter.drafted and drafter.accept == 0.8 and drafter.depth > 0
    assert proposals("colo", fleet, steep, full) == proposals("cloud-lookup", fleet, steep, full)
    assert not proposals("colo", fleet, steep, full).drafted
    one = simulate_many("cloud-lookup", 1, LINK, fleet, steep)
    many = simulate_many("cloud-lookup", 32, LINK, fleet, steep)
    assert many["nodes_per_token"] < one["nodes_per_token"]


def test_an_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="'sd'.*ar, acespec, colo, cloud-lookup"):
        simulate_many("sd", 2, LINK, Fleet(), GPU_LIKE)


def test_predict_puts_the_model_beside_each_measured_row():
    from acespec.sim.load import LoadConfig, predict

    runs = [{"mode": "ar", "clients": 1, "aggregate_tok_s": 20.0, "all_live_tok_s": 40.0},
            {"mode": "acespec-gap", "clients": 1}, {"mode": "acespec", "clients": 4}]
    rows = predict(LoadConfig(), runs, accept=0.8, lookup_accept=0.3)
    assert [(r["mode"], r["clients"]) for r in rows] == [("ar", 1), ("acespec", 4)]
    assert runs[0]["predicted_per_client_tok_s_p10"] > 0
    assert "predicted_aggregate_tok_s" in runs[2] and "predicted_verifier_busy" not in runs[1]
    ar = rows[0]["aggregate_tok_s"]  # against each measured figure; None where none
    assert rows[0]["vs_aggregate"] == round(ar / 20, 2) and rows[0]["vs_all_live"] == \
        round(ar / 40, 2)
    assert rows[1]["vs_aggregate"] is None and rows[1]["vs_all_live"] is None
