"""Sweeps of the discrete-event model (fast, virtual time): tokens/s of each mode over
bandwidth x RTT x draft depth, with costs from `acespec bench calibrate`."""

from __future__ import annotations

from dataclasses import replace

from acespec.sim.des import Costs, Scenario, simulate
from acespec.sim.stages import LinkSpec

MODES = ("ar", "sd", "pipeline", "acespec", "acespec-ideal")


def sweep(costs: Costs, accept: float, hit_rate: float, rates_bps, rtts_s, depths,
          tokens: int = 400, branch_nodes: int = 4, seed: int = 0) -> list[dict]:
    """One row per (rate, rtt, depth): tokens/s per mode (window = 2 x depth; acespec-ideal
    is the state cache whose hits keep the pipeline flowing) and speedups over ar."""
    rows = []
    for bps in rates_bps:
        for rtt in rtts_s:
            link = LinkSpec(bps, bps, rtt)
            ar = simulate(Scenario("ar", link, tokens=tokens, seed=seed), costs).tokens_per_s
            for d in depths:
                base = Scenario("sd", link, accept=accept, depth=d, window=2 * d, tokens=tokens,
                                hit_rate=hit_rate, branch_nodes=branch_nodes, seed=seed)
                row = {"rate_kbps": bps / 1000, "rtt_ms": rtt * 1000, "depth": d, "ar": round(ar, 1)}
                for mode in MODES[1:]:
                    sc = replace(base, mode="acespec", hit_continues=True) \
                        if mode == "acespec-ideal" else replace(base, mode=mode)
                    row[mode] = round(simulate(sc, costs).tokens_per_s, 1)
                row.update({f"{m}_x_ar": round(row[m] / ar, 2) for m in MODES[1:]})
                rows.append(row)
    return rows


def best_per_link(rows: list[dict]) -> list[dict]:
    """For each (rate, rtt): every mode at its best depth."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["rate_kbps"], r["rtt_ms"])
        cur = out.setdefault(key, {"rate_kbps": key[0], "rtt_ms": key[1], "ar": r["ar"]})
        for m in MODES[1:]:
            if r[m] > cur.get(m, 0):
                cur[m], cur[f"{m}_depth"] = r[m], r["depth"]
    for cur in out.values():
        cur.update({f"{m}_x_ar": round(cur[m] / cur["ar"], 2) for m in MODES[1:]})
    return list(out.values())
