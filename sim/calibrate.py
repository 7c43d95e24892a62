"""Costs of the discrete-event model, measured on the real components (`acespec bench
calibrate`): drafter seconds per token, target seconds per pass against nodes (plus the
testbed's --emulate-step-ms profile), wire bytes per message and per node each way (socket
level, from real sessions through a counting proxy), and the pair's per-position acceptance.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
from acespec.models import DEMO_TARGET
from acespec.shared.config import SamplingParams
from acespec.shared.sampling import PositionalRng
from acespec.sim.bench import BenchConfig, load_prompts, parse_links, run_bench
from acespec.sim.des_scenario import ModelCosts


def acceptance_from_al(al: float, depth: int) -> float:
    """Per-position acceptance a with E[tokens per round] = (1 - a^(d+1)) / (1 - a) = al."""
    lo, hi = 0.0, 0.9999
    for _ in range(60):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if (1 - a ** (depth + 1)) / (1 - a) < al else (lo, a)
    return (lo + hi) / 2


def lookup_acceptance(per_lone: float, k: int) -> float:
    """The per-position acceptance a at which a lone pass with k proposals decides, on
    average, per_lone tokens: 1 + a + ... + a^k = per_lone, the sum acceptance_from_al
    inverts (it folds in the passes where prompt lookup found nothing to propose). 0 for
    per_lone <= 1 or k = 0."""
    return acceptance_from_al(per_lone, k) if k > 0 and per_lone > 1 else 0.0


def time_target(model_dir: str, emulate: str, sizes=(1, 4, 8, 16, 32)) -> tuple[float, float]:
    """(base s, per-node s) of one verifier pass: the real forward of n chain nodes after a
    64-token prefix, plus the emulated step, fitted by least squares."""
    # lazy: torch, imported when the target is timed (`acespec bench` runs without it)
    from acespec.cloud.target.loader import load_model, set_threads
    from acespec.cloud.target.packed import select_linear
    from acespec.cloud.verify.batcher import StepEmulation

    model = load_model(model_dir or DEMO_TARGET)
    set_threads(model, 0)
    select_linear("auto", model)  # as `cloud serve` runs it
    emu = StepEmulation.parse(emulate)
    xs, ys = [], []
    for n in sizes:
        runs = []
        for _ in range(5):
            cache = model.new_cache()
            model(list(range(3, 67)), cache, last_only=True)
            t = time.perf_counter()
            model(list(range(5, 5 + n)), cache)
            runs.append(time.perf_counter() - t + emu.seconds(n))
        xs.append(n)
        ys.append(statistics.median(runs))
    per, base = np.polyfit(xs, ys, 1)
    return float(max(base, 0.0)), float(max(per, 0.0))


def time_drafter(drafter_path: str, tokens: int = 32) -> float:
    """Median seconds per drafted token (greedy, one sequence)."""
    d = LlamaDrafter(drafter_path, LlamaDrafterConfig(n_seq_max=1))
    prompt = list(range(10, 74))
    runs = []
    for i in range(5):
        d.truncate(0, 0)
        d.draft(prompt, 1, SamplingParams(), PositionalRng(0, 64, 0))  # prefill outside
        t = time.perf_counter()
        d.draft(prompt, tokens, SamplingParams(), PositionalRng(i, 64, 0))
        runs.append((time.perf_counter() - t) / tokens)
    d.close()
    return float(statistics.median(runs))


def fit_bytes(records: list[dict]) -> dict:
    """Least squares over sd runs: total bytes = Extends x per-message + nodes x per-node,
    each way; and ar's downlink bytes per streamed token."""
    rows, up, down = [], [], []
    for r in records:
        if r["mode"] != "sd":
            continue
        extends = r["passes"] - 1  # the Open's pass is not an Extend
        nodes = r["drafted"] + max(0, extends - 1)  # each later Extend leads with a head token
        rows.append([extends, nodes])
        up.append(r["wire_bytes_up"])
        down.append(r["wire_bytes_down"])
    a = np.array(rows, dtype=float)
    (ub, un), (db, dn) = (np.linalg.lstsq(a, np.array(y, float), rcond=None)[0] for y in (up, down))
    ar = [r["wire_bytes_down"] / max(1, r["tokens"]) for r in records if r["mode"] == "ar"]
    return {"up_base": float(ub), "up_per_node": float(max(un, 0.0)), "down_base": float(db),
            "down_per_node": float(max(dn, 0.0)),
            "ar_down_per_token": float(np.mean(ar)) if ar else 18.0}


def calibrate(model_dir: str, drafter_path: str, emulate: str = "40,0.5",
              per_category: int = 2, max_tokens: int = 48) -> dict:
    """Every cost of acespec.sim.des_scenario.ModelCosts, plus the measured acceptance, hit rate and the
    verifier's prompt-lookup proposals (tokens per lone pass, and the per-position
    acceptance that gives them with the bench's --propose)."""
    prompts = load_prompts(None, per_category)
    records = []
    for depth in (2, 8):
        modes = ("ar", "sd", "acespec") if depth == 8 else ("sd",)
        cfg = BenchConfig(links=parse_links("loopback"), modes=modes, depth=depth,
                          window=depth, max_tokens=max_tokens, emulate=emulate)
        records += [dict(r, depth=depth)
                    for r in asyncio.run(run_bench(cfg, model_dir, drafter_path, prompts))]
    base, per = time_target(model_dir, emulate)
    costs = ModelCosts(draft_s=time_drafter(drafter_path), target_base_s=base,
                  target_per_node_s=per, **fit_bytes(records))
    sd8 = [r for r in records if r["mode"] == "sd" and r["depth"] == 8]
    al = sum(r["tokens"] for r in sd8) / max(1, sum(r["rounds"] for r in sd8))
    ace = [r for r in records if r["mode"] == "acespec"]
    rej = sum(r["cache_rejections"] for r in ace)
    lone = sum(r.get("lone_passes") or 0 for r in ace)
    per_lone = sum(r.get("lone_tokens") or 0 for r in ace) / lone if lone else 1.0
    propose = BenchConfig.propose  # what the runs above gave the verifier
    return {"costs": asdict(costs), "emulate_step_ms": emulate,
            "sd_tokens_per_round_depth8": round(al, 3),
            "acceptance": round(acceptance_from_al(al, 8), 4),
            "hit_rate": round(sum(r["cache_hits"] for r in ace) / rej, 4) if rej else 0.0,
            "lone_tokens_per_pass": round(per_lone, 3), "propose": propose,
            "lookup_acceptance": round(lookup_acceptance(per_lone, propose), 4),
            "prompts": len(prompts), "max_tokens": max_tokens}


def load_calibration(path: str | Path) -> tuple[ModelCosts, dict]:
    data = json.loads(Path(path).read_text())
    return ModelCosts(**data["costs"]), data
