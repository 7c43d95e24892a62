"""The discrete-event model against the real system, on cases both can run: costs from
`calibrate` on the tiny pair (real verifier, real llama.cpp drafter, real sockets), then the
same link and modes through the real proxy and in the model.

Stated tolerance: the model's tokens/s within 35 % of the real run for ar, sd, pipeline and
acespec (greedy, so the verifier decides and the edge grows its speculation tree: the
model's decided engine with `tree`, at the hit rate the real run measured, and with the
verifier's own proposals deciding what the real run's lone passes decided), and acespec-gap
(the same with the verifier's gap drafter proposing, each proposal costing what the real
run's gap drafter spent per proposal) (mean over 20
model seeds; 5 prompts, 48 tokens each, real). The model knows the pair only through one
per-position acceptance figure (and that hit rate), and the shared 2-core machine adds
noise."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.sim.bench import BenchConfig, load_prompts, parse_links, run_bench  # noqa: E402
from acespec.sim.calibrate import calibrate, lookup_acceptance  # noqa: E402
from acespec.sim.des import ModelCosts, Scenario, simulate  # noqa: E402

EMULATE = "20,0.5"
LINK = "100kbit:40ms"
TOLERANCE = 0.35


@pytest.mark.slow
def test_model_agrees_with_the_real_system(tiny_hf_dir, noisy_gguf):
    cal = calibrate(str(tiny_hf_dir), str(noisy_gguf), EMULATE, per_category=1, max_tokens=48)
    costs = ModelCosts(**cal["costs"])
    prompts = load_prompts(None, 1)
    cfg = BenchConfig(links=parse_links(LINK),
                      modes=("ar", "sd", "pipeline", "acespec", "acespec-gap"), depth=4,
                      window=8, max_tokens=48, emulate=EMULATE, gap_drafter=str(noisy_gguf))
    records = asyncio.run(run_bench(cfg, str(tiny_hf_dir), str(noisy_gguf), prompts))
    (_, spec), = cfg.links
    report = {}
    for mode in cfg.modes:
        runs = [r for r in records if r["mode"] == mode]
        real = sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs)
        hits = sum(r["cache_hits"] for r in runs) / max(1, sum(r["cache_rejections"] for r in runs))
        tree = mode.startswith("acespec")
        lone = sum(r.get("lone_passes") or 0 for r in runs)
        proposed = sum(r.get("verifier_proposed") or 0 for r in runs)
        gap_s = sum(r.get("gap_s") or 0.0 for r in runs) / max(1, proposed)  # per proposal
        per_lone = sum(r.get("lone_tokens") or 0 for r in runs) / max(1, lone)
        model = np.mean([simulate(Scenario("acespec" if tree else mode, spec,
                                           accept=cal["acceptance"], depth=4,
                                           window=8, tokens=48, seed=s, decided=tree,
                                           tree=tree, hit_rate=hits, branch_depth=4,
                                           propose=cfg.propose if tree else 0,
                                           propose_accept=lookup_acceptance(per_lone, cfg.propose),
                                           propose_s=gap_s),
                                  costs).tokens_per_s for s in range(20)])
        report[mode] = (round(real, 1), round(float(model), 1))
    print("tokens/s (real, model):", report, "acceptance", cal["acceptance"], cal["costs"])
    for mode, (real, model) in report.items():
        assert abs(model / real - 1) <= TOLERANCE, (mode, real, model)
