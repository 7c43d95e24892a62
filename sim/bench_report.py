"""The real-system benchmark's report: per (link, mode) and per category summaries of the
runs `acespec.sim.bench` recorded, as rows, a markdown table and PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from acespec.sim.bench import BenchConfig


def summarize(records: list[dict], cfg: BenchConfig) -> list[dict]:
    """Per (link, mode): throughput, latency, acceptance, bytes, passes, ideal-bound ratio
    and speedups over ar and sd measured in the same run."""
    from acespec.cloud.verify.batcher import StepEmulation  # lazy: the batcher imports torch

    emu = StepEmulation.parse(cfg.emulate)
    step_s = emu.seconds(cfg.depth + 1) or None
    rows = []
    for label in dict.fromkeys(r["link"] for r in records):
        per_mode = {}
        for mode in dict.fromkeys(r["mode"] for r in records):
            rs = [r for r in records if r["link"] == label and r["mode"] == mode]
            if not rs:
                continue
            tok = sum(r["tokens"] for r in rs)
            sec = sum(r["seconds"] for r in rs)
            rounds = sum(r["rounds"] for r in rs)
            per_mode[mode] = {
                "link": label, "mode": mode, "tokens": tok,
                "tokens_per_s": round(tok / sec, 2),
                "ttft_s": round(float(np.mean([r["ttft_s"] for r in rs])), 3),
                "itl_p50_ms": round(float(np.median([r["itl_p50_ms"] for r in rs])), 1),
                "itl_p99_ms": round(float(np.percentile([r["itl_p99_ms"] for r in rs], 99)), 1),
                "mean_acceptance_length": round(tok / max(rounds, 1), 3),
                "cache_hit_rate": round(sum(r["cache_hits"] for r in rs) /
                                        max(1, sum(r["cache_rejections"] for r in rs)), 3),
                "wire_bytes_up_per_token": round(sum(r["wire_bytes_up"] for r in rs) / tok, 2),
                "wire_bytes_down_per_token": round(sum(r["wire_bytes_down"] for r in rs) / tok, 2),
                **_naive(rs, tok),
                "up_messages_per_token": round(sum(r.get("messages_up", 0) for r in rs) / tok, 3),
                "passes_per_token": round(sum(r["passes"] for r in rs) / tok, 3),
                **_seen(rs, tok), **_verifier_cost(rs, tok), **_idle(rs), **_same_as_ar(records, rs),
            }
        sd_al = per_mode.get("sd", {}).get("mean_acceptance_length")
        for m in per_mode.values():
            for base in ("ar", "sd"):
                if base in per_mode:
                    m[f"speedup_vs_{base}"] = round(m["tokens_per_s"] /
                                                   per_mode[base]["tokens_per_s"], 2)
            if sd_al and step_s:
                m["ideal_tokens_per_s"] = round(sd_al / step_s, 2)
                m["ratio_to_ideal"] = round(m["tokens_per_s"] / m["ideal_tokens_per_s"], 3)
            rows.append(m)
    return rows


def _verifier_cost(rs: list[dict], tok: int) -> dict:
    """The verifier's busy seconds per 1,000 tokens (its passes and its drafting), and where
    the tokens came from: accepted edge drafts, the verifier's own accepted proposals, and
    passes no edge draft covered (lone; proposals taken there included). Sessions without
    the verifier's account (ar, sd, pipeline) count every token not from an edge draft as
    lone."""
    timed = [r for r in rs if r.get("verifier_s") is not None]
    edge = sum(r.get("from_edge_drafts") or 0 for r in rs)
    lone = sum(r["lone_tokens"] if r.get("lone_tokens") is not None
               else r["tokens"] - (r.get("from_edge_drafts") or 0) for r in rs)
    return {"verifier_s_per_1k_tokens": round(1000 * sum(r["verifier_s"] for r in timed)
                                              / max(1, sum(r["tokens"] for r in timed)), 2)
            if timed else None,
            "tokens_from_edge_drafts": edge,
            "tokens_from_proposals": sum(r.get("proposed_accepted") or 0 for r in rs),
            "tokens_from_lone_passes": lone}


def _naive(rs: list[dict], tok: int) -> dict:
    """Bytes per token a naive protocol would have sent for the same sessions (dense
    distributions both ways: acespec.proto.sizes.naive_bytes); None where the edge drafts
    nothing."""
    out = {}
    for way in ("up", "down"):
        sent = [r.get(f"naive_bytes_{way}") for r in rs]
        out[f"naive_bytes_{way}_per_token"] = None if None in sent else round(sum(sent) / tok, 1)
    return out


def _seen(rs: list[dict], tok: int) -> dict:
    """What the user saw across runs: the longest gap between tokens (verified or, offline,
    unverified), tokens lost (never delivered, verified or not: must be 0), and the share
    of tokens first shown unverified (acespec-local)."""
    gaps = [r["longest_gap_s"] for r in rs if r.get("longest_gap_s") is not None]
    out = {"longest_gap_s": max(gaps) if gaps else None,
           "tokens_lost": sum(r.get("tokens_lost") or 0 for r in rs)}
    if any(r.get("unverified_tokens") for r in rs):
        out["unverified_share"] = round(sum(r["unverified_tokens"] for r in rs) / tok, 3)
    return out


def _same_as_ar(records: list[dict], rs: list[dict]) -> dict:
    """How many of the mode's prompts produced exactly ar's tokens on the same link ("n/m";
    greedy and coupled sessions must give m/m)."""
    ar = {r["prompt"]: r.get("token_ids") for r in records
          if r["mode"] == "ar" and r["link"] == rs[0]["link"]}
    both = [r for r in rs if r["prompt"] in ar and r.get("token_ids") is not None]
    if not both or rs[0]["mode"] == "ar":
        return {}
    same = sum(r["token_ids"] == ar[r["prompt"]] for r in both)
    return {"same_as_ar": f"{same}/{len(both)}"}


def _idle(rs: list[dict]) -> dict:
    """The verifier's idle-time figures over runs: busy fraction (mean over runs that report
    it), dead drafts skipped, tokens decided with no draft, walks into guessed branches and
    those that restarted (totals); the speculation tree's widest and deepest (maxima)."""
    return {"verifier_busy": _mean(rs, "verifier_busy"),
            "dead_nodes_skipped": sum(r.get("dead_nodes_skipped", 0) for r in rs),
            "continuation_tokens": sum(r.get("continuation_tokens", 0) for r in rs),
            "verifier_hits": sum(r.get("verifier_hits") or 0 for r in rs),
            "edge_hits": sum(r.get("cache_hits") or 0 for r in rs),
            "hits_restarted": sum(r.get("hits_restarted") or 0 for r in rs),
            "drafts_in_time": _mean(rs, "drafts_in_time"),
            "tree_width": max((r.get("tree_width") or 0 for r in rs), default=0),
            "tree_depth": max((r.get("tree_depth") or 0 for r in rs), default=0),
            **_passes(rs)}


def _mean(rs: list[dict], key: str) -> float | None:
    """The mean of a per-run rate over the runs that report it."""
    vals = [r[key] for r in rs if r.get(key) is not None]
    return round(float(np.mean(vals)), 3) if vals else None


def _passes(rs: list[dict]) -> dict:
    """Decided sessions' passes over runs: lone passes (no edge draft) and the tokens each
    decided, the verifier's proposals accepted of proposed, passes with drafts and their
    tokens per pass, dead nodes per token. Empty where no run reports them."""
    rs = [r for r in rs if r.get("lone_passes") is not None]
    if not rs:
        return {}
    tot = {k: sum(r[k] for r in rs) for k in ("lone_passes", "lone_tokens", "verifier_proposed",
                                              "proposed_accepted", "draft_passes",
                                              "draft_pass_tokens", "tokens",
                                              "dead_nodes_skipped")}
    return {"lone_passes": tot["lone_passes"],
            "tokens_per_lone_pass": round(tot["lone_tokens"] / max(1, tot["lone_passes"]), 2),
            "proposed_accepted": f"{tot['proposed_accepted']}/{tot['verifier_proposed']}",
            "draft_passes": tot["draft_passes"],
            "tokens_per_draft_pass": round(tot["draft_pass_tokens"] / max(1, tot["draft_passes"]),
                                           2),
            "dead_nodes_per_token": round(tot["dead_nodes_skipped"] / max(1, tot["tokens"]), 2),
            "gap_ms_per_token": round(1000 * sum(r.get("gap_s") or 0.0 for r in rs)
                                      / max(1, tot["tokens"]), 2)}


def by_category(records: list[dict]) -> list[dict]:
    """Per (link, mode, category): tokens/s, mean acceptance length and the speedup over ar
    on the same link and category."""
    out = []
    keys = dict.fromkeys((r["link"], r["mode"], r["category"]) for r in records)
    for link, mode, cat in keys:
        rs = [r for r in records if (r["link"], r["mode"], r["category"]) == (link, mode, cat)]
        tok, sec = sum(r["tokens"] for r in rs), sum(r["seconds"] for r in rs)
        rounds = sum(r["rounds"] for r in rs)
        out.append({"link": link, "mode": mode, "category": cat, "prompts": len(rs),
                    "tokens_per_s": round(tok / sec, 2),
                    "mean_acceptance_length": round(tok / max(rounds, 1), 3)})
    for row in out:
        ar = next((r for r in out if (r["link"], r["mode"], r["category"]) ==
                   (row["link"], "ar", row["category"])), None)
        if ar and row["mode"] != "ar":
            row["speedup_vs_ar"] = round(row["tokens_per_s"] / ar["tokens_per_s"], 2)
    return out


def markdown(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def plot(summary: list[dict], cats: list[dict], folder: str) -> list[Path]:
    """PNG plots: tokens/s per link and mode; wire bytes/token; acceptance by category."""
    import matplotlib  # lazy: the sim extra's, for the plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as matplotlib's, once its backend is set

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    links = list(dict.fromkeys(r["link"] for r in summary))
    modes = list(dict.fromkeys(r["mode"] for r in summary))
    files = []
    for metric, name in (("tokens_per_s", "tokens_per_s.png"),
                         ("wire_bytes_up_per_token", "bytes_per_token.png")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for m in modes:
            ax.plot(links, [next((r[metric] for r in summary if r["link"] == lk and
                                  r["mode"] == m), np.nan) for lk in links], "o-", label=m)
        ax.set_xlabel("link")
        ax.set_ylabel(metric)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name)
        plt.close(fig)
        files.append(out / name)
    fig, ax = plt.subplots(figsize=(7, 4))
    categories = list(dict.fromkeys(r["category"] for r in cats))
    for m in (x for x in modes if x != "ar"):
        ax.bar([f"{c}\n{m}" for c in categories],
               [np.mean([r["mean_acceptance_length"] for r in cats
                         if r["mode"] == m and r["category"] == c]) for c in categories])
    ax.set_ylabel("mean acceptance length")
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_category.png")
    plt.close(fig)
    files.append(out / "acceptance_by_category.png")
    return files
