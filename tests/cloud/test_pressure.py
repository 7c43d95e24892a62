"""Load-aware speculation (docs/design.md §3), on scripted passes and no clock: the
verifier proposes as deep as pays when it is idle, and stops proposing, and scores only
likely drafts, when its passes are beyond the cost line's knee and full of other sessions."""

from __future__ import annotations

import pytest

from acespec.cloud.verify.pressure import Pressure
from acespec.cloud.verify.proposals import Depth, PassCost, worth_depth


def gpu_like(n: int) -> float:
    """A roofline: 25 ms up to 256 nodes, then 0.1 ms a node."""
    return 0.025 + 0.0001 * max(0, n - 256)


def cpu_like(n: int) -> float:
    return 0.040 + 0.0005 * n


RATES = [0.7] * 8


def test_idle_the_verifier_proposes_as_deep_as_pays():
    assert worth_depth(RATES, gpu_like, fed=1) == 8  # flat: every proposal is free
    assert worth_depth(RATES, cpu_like, fed=1) == 8  # 0.5 ms a node beside a 40 ms pass
    assert worth_depth([0.7, 0.0, 0.0], cpu_like, fed=1) == 1  # what is never taken is not


def test_below_the_knee_others_in_the_pass_change_nothing():
    assert worth_depth([0.3] * 8, gpu_like, fed=1, base_nodes=100, base_tokens=50.0) == 8


def test_beyond_the_knee_a_proposal_must_beat_the_pass_per_second():
    """1,000 other nodes deciding 400 tokens: the pass (0.0995 s) decides 4,030 tokens/s and
    a node costs 0.1 ms more. A proposal reached and taken 3 times in 10 adds 3,000 tokens/s
    of that time: none is worth it. Taken 7 in 10, the i-th adds 0.7^i / 0.1 ms: 7,000 and
    4,900 beat 4,030, 3,430 does not. With 200 tokens (2,020 tokens/s) four do."""
    assert worth_depth([0.3] * 8, gpu_like, fed=1, base_nodes=1000, base_tokens=400.0) == 0
    assert worth_depth(RATES, gpu_like, fed=1, base_nodes=1000, base_tokens=400.0) == 2
    assert worth_depth(RATES, gpu_like, fed=1, base_nodes=1000, base_tokens=200.0) == 4
    assert worth_depth(RATES, cpu_like, fed=1, base_nodes=200, base_tokens=100.0) == 2


def test_depth_passes_the_others_on():
    depth = Depth(8)
    for n in (1, 64, 256, 512, 1024, 2048):
        for _ in range(3):
            depth.cost.observe(n, gpu_like(n))
    for _ in range(30):
        depth.settle(2, 8, 8)  # order-2 proposals are always taken
    assert depth.depth(2, 8, 1) == 8
    assert depth.depth(2, 8, 1, base=(1500, 3000.0)) == 0  # 2 tokens a node: 20,000 tok/s


def _pressure(sessions: int, nodes: int, tokens: int) -> Pressure:
    p = Pressure()
    for _ in range(100):
        p.on_pass(sessions, nodes)
        p.on_decided(tokens)
    return p


def test_pressure_knows_the_others():
    p = _pressure(sessions=8, nodes=400, tokens=3)
    nodes, tokens = p.others()
    assert nodes == pytest.approx(350, abs=2) and tokens == pytest.approx(21, abs=0.5)
    assert _pressure(1, 10, 3).others() == (0, 0.0)


def test_a_node_is_worth_scoring_while_the_pass_is_flat_or_it_is_likely():
    cost = PassCost()
    for n in (1, 64, 256, 512, 1024, 2048):
        for _ in range(3):
            cost.observe(n, gpu_like(n))
    assert _pressure(8, 200, 3).worth(0.05, cost)  # below the knee: free
    busy = _pressure(32, 1500, 3)  # 96 tokens a pass of 0.15 s: 640 tok/s; a node 0.1 ms
    assert not busy.worth(0.05, cost)  # 500 tok/s of marginal time
    assert busy.worth(0.2, cost)  # 2,000


def test_the_cost_finds_a_gpu_like_knee_and_a_cpu_like_line():
    gpu, cpu = PassCost(), PassCost()
    for n in (1, 8, 32, 64, 128, 192, 256, 320, 400, 512, 700, 1000):
        gpu.observe(n, gpu_like(n))
        cpu.observe(n, cpu_like(n))
    base, per_node, knee = gpu.hinge()
    assert knee == 256 and base == pytest.approx(0.025) and per_node == pytest.approx(1e-4)
    assert gpu.slope(100) == 0 and gpu.slope(300) == pytest.approx(1e-4)
    base, per_node, knee = cpu.hinge()
    assert knee == 0 and per_node == pytest.approx(5e-4)
    assert cpu.slope(10) == pytest.approx(5e-4)


def test_a_session_keeps_its_share_until_the_pass_is_full_then_the_floor():
    from acespec.cloud.verify.share import FLOOR, Share
    cost = PassCost()
    for n in (1, 64, 256, 512, 1024, 2048):
        for _ in range(3):
            cost.observe(n, gpu_like(n))
    share = Share(cap=64, scored=20.0, accepted=1.0)  # one node in twenty taken: 500
    # tokens per second of a node's marginal 0.1 ms, where the full pass decides 644
    assert share.nodes() > FLOOR
    assert _pressure(8, 200, 3).budget(share, cost) == share.nodes()
    assert _pressure(32, 1500, 3).budget(share, cost) == FLOOR
