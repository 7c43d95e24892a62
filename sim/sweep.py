"""Sweeps of the discrete-event model (fast, virtual time): tokens/s of each mode over
bandwidth x RTT x draft depth, with costs from `acespec bench calibrate`."""

from __future__ import annotations

from dataclasses import replace

from acespec.cloud.verify.proposals import worth_depth
from acespec.shared import modes
from acespec.sim.des import ModelCosts, Scenario, simulate
from acespec.sim.stages import LinkSpec

# The modes the model sweeps, rows of acespec.shared.modes, greedy or coupled (the model
# reads each row: who drafts, who decides, branches, the gap drafter). A mode the verifier
# decides never waits for the edge; with the gap drafter, each pass no draft covers proposes
# as many tokens (up to GAP_PROPOSE) as the verifier's rule finds worth it
# (acespec.cloud.verify.proposals.worth_depth), accepted like the edge's drafts and each
# costing the drafter's own decode time. acespec-exact is the edge deciding (pipeline plus
# the speculation tree's guessed branches). With lookup_accept > 0, the decided modes' lone
# passes score the verifier's prompt-lookup proposals (cloud serve --propose, up to
# GAP_PROPOSE, free to find), each taken with that per-position acceptance
# (acespec.sim.calibrate.lookup_acceptance fits it to a real run's tokens per lone pass).
MODES = ("ar", "sd", "pipeline", "acespec-exact", "acespec-chain", "acespec", "acespec-gap")
DECIDED = tuple(m for m in MODES if modes.mode(m).verifier_decides(True))
GAP_PROPOSE = 8  # cloud serve --propose's default: the most a lone pass scores


def _scenario(base: Scenario, name: str, costs: ModelCosts, lookup_accept: float = 0.0
              ) -> Scenario:
    """The model's scenario for mode `name`, from its row."""
    m = modes.mode(name)
    if m.cloud_only:
        return replace(base, mode="ar")
    if m.decides == "edge":
        kind = "acespec" if m.branches else "pipeline" if m.pipelined else "sd"
        return replace(base, mode=kind)
    tree = {"tree": True, "branch_depth": 4} if m.branches else {}
    sc = replace(base, mode="acespec", decided=True, **tree)
    if m.gap:
        k = worth_depth([base.accept] * GAP_PROPOSE, costs.target_s, 1, costs.draft_s)
        return replace(sc, propose=k, propose_accept=base.accept, propose_s=costs.draft_s)
    if lookup_accept:
        return replace(sc, propose=GAP_PROPOSE, propose_accept=lookup_accept)
    return sc


def sweep(costs: ModelCosts, accept: float, hit_rate: float, rates_bps, rtts_s, depths,
          tokens: int = 400, branch_nodes: int = 4, seed: int = 0,
          lookup_accept: float = 0.0, hold_s: float = 0.0) -> list[dict]:
    # One seed of 400 tokens per point: the sweep is for shapes of curves, not decimals.
    """One row per (rate, rtt, depth, window in {depth, 2 x depth}): tokens/s per mode,
    speedups over ar, each mode's verifier_busy (fraction of the session's time the
    verifier spent in passes) and, for the decided modes, its lone share (passes no edge
    draft covered, of all passes). sd ignores the window. lookup_accept: see MODES; hold_s:
    the decided modes' verifier idles up to this long for drafts on their way
    (acespec.sim.des.Scenario.hold_s: what waiting for the edge would buy; 0 as built)."""
    rows = []
    for bps in rates_bps:
        for rtt in rtts_s:
            link = LinkSpec(bps, bps, rtt)
            ar = simulate(Scenario("ar", link, tokens=tokens, seed=seed), costs)
            for d, w in ((k, w) for k in depths for w in (k, 2 * k)):
                base = Scenario("sd", link, accept=accept, depth=d, window=w, tokens=tokens,
                                hit_rate=hit_rate, branch_nodes=branch_nodes, seed=seed,
                                hold_s=hold_s)
                row = {"rate_kbps": bps / 1000, "rtt_ms": rtt * 1000, "depth": d, "window": w,
                       "ar": round(ar.tokens_per_s, 1), "ar_busy": round(ar.verifier_busy, 2)}
                for mode in MODES[1:]:
                    res = simulate(_scenario(base, mode, costs, lookup_accept), costs)
                    row[mode] = round(res.tokens_per_s, 1)
                    row[f"{mode}_busy"] = round(res.verifier_busy, 2)
                    if mode in DECIDED:
                        row[f"{mode}_lone"] = round(res.lone_passes / max(1, res.rounds), 2)
                row.update({f"{m}_x_ar": round(row[m] / row["ar"], 2) for m in MODES[1:]})
                rows.append(row)
    return rows


def best_per_link(rows: list[dict]) -> list[dict]:
    """For each (rate, rtt): every mode at its best (depth, window), and the decided
    modes' verifier_busy and lone share there."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["rate_kbps"], r["rtt_ms"])
        cur = out.setdefault(key, {"rate_kbps": key[0], "rtt_ms": key[1], "ar": r["ar"]})
        for m in MODES[1:]:
            if r[m] > cur.get(m, 0):
                cur[m], cur[f"{m}_shape"] = r[m], f"{r['depth']}/{r['window']}"
                if m in DECIDED:
                    cur[f"{m}_busy"], cur[f"{m}_lone"] = r[f"{m}_busy"], r[f"{m}_lone"]
    for cur in out.values():
        cur.update({f"{m}_x_ar": round(cur[m] / cur["ar"], 2) for m in MODES[1:]})
    return list(out.values())
