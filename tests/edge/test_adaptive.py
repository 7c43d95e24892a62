"""Adaptive depth/window and the link estimate (acespec.edge.speculation.adaptive), the recovery model of
the speculation tree, and one real run over a link whose bandwidth drops mid-generation."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.edge.speculation.adaptive import (
    LinkBudgets,
    LinkEstimate,
    Shape,
    choose_shape,
    cycle_seconds,
    tokens_per_cycle,
)
from acespec.edge.speculation.calibration import RecoveryModel


def exchanges(est: LinkEstimate, rng, n: int, base: float, bw: float, step: float) -> None:
    """Feed n synthetic exchanges: network time base + bytes/bw + queueing >= 0 on the
    wire, verifier time step + its own queue >= 0."""
    for _ in range(n):
        up, down = int(rng.integers(20, 200)), int(rng.integers(20, 400))
        wire_q = rng.exponential(0.02) * (rng.random() < 0.7)  # most exchanges queue a bit
        server = step + rng.exponential(0.03) * (rng.random() < 0.5)
        est.observe(up, down, base + (up + down) / bw + wire_q + server, server)


def test_link_estimate_recovers_the_link():
    """Tolerances: bandwidth within 25 %, base round trip within 5 ms, pass time within
    1 ms, on 24 exchanges with random queueing (seed 0)."""
    est = LinkEstimate()
    exchanges(est, np.random.default_rng(0), 24, base=0.050, bw=6250, step=0.042)
    assert est.ready
    assert abs(est.bandwidth() / 6250 - 1) < 0.25, est.bandwidth()
    assert abs(est.base_rtt() - 0.050) < 0.005, est.base_rtt()
    assert abs(est.step() - 0.042) < 0.001


def test_link_estimate_follows_a_bandwidth_change():
    est = LinkEstimate()
    rng = np.random.default_rng(1)
    exchanges(est, rng, 24, base=0.05, bw=125_000, step=0.04)
    fast = est.bandwidth()
    exchanges(est, rng, 24, base=0.05, bw=6250, step=0.04)  # the window has turned over
    slow = est.bandwidth()
    assert fast > 80_000 and abs(slow / 6250 - 1) < 0.25, (fast, slow)


def test_link_estimate_without_a_slope_is_fast():
    est = LinkEstimate()
    for _ in range(6):
        est.observe(50, 50, 0.01, 0.002)  # same size every time: no slope to read
    assert est.bandwidth() == 1e9 and est.base_rtt() == pytest.approx(0.008, abs=1e-6)


def test_speedup_model_closed_form():
    assert tokens_per_cycle(0.0, 8) == 1.0
    assert tokens_per_cycle(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    s = Shape(4, 8)
    fast = cycle_seconds(0.05, 1e9, s, 0.0)
    assert fast == pytest.approx(0.05, abs=1e-5)
    assert cycle_seconds(0.05, 6250, s, 0.0) > fast
    assert cycle_seconds(0.05, 1e9, s, 0.0, step_s=0.04) == pytest.approx(0.05 + 0.04 + 0.02, abs=1e-5)


def test_shape_follows_the_link_and_acceptance():
    cur = Shape(4, 16)
    # A fast link with a free verifier: a wide window pays.
    assert choose_shape(0.9, 0.05, 1e9, 1e-3, cur).window >= 24
    # A slow link and an expensive verifier pass: fewer chunks in flight.
    slow = choose_shape(0.7, 0.06, 6250, 1e-3, cur, step_s=0.05)
    assert slow.window < 16 and slow.window // slow.depth <= 2, slow
    # Poor acceptance: long chains are wasted bytes.
    assert choose_shape(0.2, 0.06, 6250, 1e-3, cur, step_s=0.05).window <= 4


def test_shape_is_stable_under_noise():
    """Hysteresis: 200 noisy re-estimates of one link (acceptance +-0.03, RTT +-5 ms,
    bandwidth +-15 %) change the shape at most twice."""
    rng = np.random.default_rng(2)
    cur, changes = Shape(4, 16), 0
    for _ in range(200):
        new = choose_shape(0.75 + rng.uniform(-0.03, 0.03), 0.06 + rng.uniform(-0.005, 0.005),
                           6250 * rng.uniform(0.85, 1.15), 1e-3, cur, step_s=0.045)
        changes += new != cur
        cur = new
    assert changes <= 2, changes


def test_link_budgets_scale_with_the_link():
    idle, up, down = LinkBudgets(share=0.25).derive(0.1, 6250, 0.01)
    assert idle == pytest.approx(90.0) and up == down == pytest.approx(0.25 * 625)
    assert LinkBudgets().derive(0.1, 1e6, 0.2)[0] == 0.0  # drafting fills the round trip


def test_recovery_model_learns_the_rank_distribution():
    rec = RecoveryModel(guesses=2, prior=8.0)
    assert rec.p(0, 0.5) == pytest.approx(0.5)  # nothing seen: the drafter's own figure
    for rank in [0] * 60 + [1] * 20 + [2] * 20:  # 60 % rank 0, 20 % rank 1, 20 % neither
        rec.observe(rank)
    assert abs(rec.p(0, 0.1) - 0.6) < 0.05 and abs(rec.p(1, 0.1) - 0.2) < 0.03
    rec.observe(7)  # beyond the guesses: counted as "none of them"
    assert rec.counts[2] == 21


def test_adaptive_run_over_a_link_whose_bandwidth_drops(tiny_pair, tmp_path):
    """Real verifier, real drafter, real proxy: 2 Mbit/s for the first 0.3 s, then 50 kbit/s
    (20 ms RTT). Greedy text equals plain greedy decoding and the shape settles: at most 4
    changes in 200 tokens (a dwell of 8 Scores and a 10 % hysteresis; it flapped 5-9 times
    without the dwell). Which shape is right after the drop depends on the pair's
    acceptance; the direction of the model is checked on synthetic figures above (the
    edge-side estimate is blurred here by the drafter's work delaying arrivals)."""
    pytest.importorskip("torch")
    pytest.importorskip("llama_cpp")
    from acespec.edge.client import channel
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
    from acespec.edge.session import EdgeEngine, EngineConfig
    from acespec.shared.tokenizer import Tokenizer
    from acespec.sim.proxy import LinkProxy
    from acespec.sim.stages import LinkSpec

    from conftest import plain_greedy
    from verifier_harness import run, running_verifier

    tok_dir, model, ggufs = tiny_pair
    tok = Tokenizer.load(tok_dir)
    prompt = tok.encode("def parse(text):\n    ")
    trace = tmp_path / "drop.csv"
    trace.write_text("time_s,kbps\n0,2000\n0.3,50\n")

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            host, port = addr.rsplit(":", 1)
            proxy = LinkProxy(host, int(port), spec=LinkSpec(5e4, 5e4, 0.02, trace=str(trace)))
            via = f"127.0.0.1:{await proxy.start()}"
            try:
                d = LlamaDrafter(ggufs["q8_0"], LlamaDrafterConfig(n_ctx=512, n_seq_max=2))
                # The tree protocol's shape adapts (greedy acespec is decided by the
                # verifier, whose edge drafts up to the widest window instead).
                cfg = EngineConfig(mode="pipeline", max_tokens=200, adaptive=True)
                return await EdgeEngine(lambda: channel(via), tok.vocab_hash(), d).generate(
                    prompt, cfg)
            finally:
                await proxy.stop()

    out, stats = run(go())
    assert out == plain_greedy(model, prompt, 200)
    print("shape", stats.depth, stats.window, "changes", stats.shape_changes, "link", stats.link)
    assert 1 <= stats.shape_changes <= 4
