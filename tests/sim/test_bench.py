"""`acespec bench` end to end on the tiny pair: every mode, every prompt, shaped and
unshaped links; the report carries the figures the issue names; plots are written."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
pytest.importorskip("matplotlib")

from acespec.sim.bench import BenchConfig, load_prompts, parse_links, run_bench  # noqa: E402
from acespec.sim.bench_report import by_category, plot, summarize  # noqa: E402

KEYS = ("tokens_per_s", "ttft_s", "itl_p50_ms", "itl_p99_ms", "mean_acceptance_length",
        "cache_hit_rate", "wire_bytes_up_per_token", "wire_bytes_down_per_token",
        "passes_per_token", "speedup_vs_ar", "speedup_vs_sd", "ratio_to_ideal",
        "naive_bytes_up_per_token", "naive_bytes_down_per_token")


def test_shipped_prompt_set_has_five_categories_of_ten():
    prompts = load_prompts()
    cats = {p["category"] for p in prompts}
    assert len(cats) >= 5 and all(sum(p["category"] == c for p in prompts) >= 10 for c in cats)


@pytest.mark.slow
def test_bench_runs_every_mode_side_by_side(tiny_pair, tiny_hf_dir, tmp_path):
    _, _, ggufs = tiny_pair
    cfg = BenchConfig(links=parse_links("loopback,500kbit:20ms"), max_tokens=8,
                      emulate="5,0.1", per_category=1)
    prompts = load_prompts(per_category=1)
    records = asyncio.run(run_bench(cfg, str(tiny_hf_dir), str(ggufs["q8_0"]), prompts))
    assert len(records) == 2 * 4 * len(prompts)
    summary = summarize(records, cfg)
    assert {(r["link"], r["mode"]) for r in summary} == {
        (lk, m) for lk in ("loopback", "500kbit:20ms") for m in ("ar", "sd", "pipeline", "acespec")}
    for row in summary:
        for k in KEYS:
            assert k in row, k
        assert row["wire_bytes_up_per_token"] > 0 and row["tokens"] == 8 * len(prompts)
        if row["mode"] != "ar":  # dense distributions cost far more than what is sent
            assert row["naive_bytes_down_per_token"] > 10 * row["wire_bytes_down_per_token"]
            assert row["naive_bytes_up_per_token"] > 10 * row["wire_bytes_up_per_token"]
    files = plot(summary, by_category(records), tmp_path / "plots")
    assert all(f.stat().st_size > 1000 for f in files)


@pytest.mark.slow
def test_bench_gap_mode_beside_the_others_from_the_command_line(tiny_pair, tiny_hf_dir,
                                                               tmp_path):
    """`acespec bench --modes ar,acespec,acespec-gap`: one verifier with --gap-drafter (the
    edge's drafter file); only acespec-gap's sessions use it, and its text is ar's."""
    import json
    import subprocess
    import sys

    _, _, ggufs = tiny_pair
    out = tmp_path / "gap.json"
    p = subprocess.run([sys.executable, "-m", "acespec", "bench", "--model", str(tiny_hf_dir),
                        "--drafter", str(ggufs["q8_0"]), "--modes", "ar,acespec,acespec-gap",
                        "--per-category", "1", "--max-tokens", "12", "--link", "loopback",
                        "--emulate-step-ms", "5,0.1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {r["mode"]: r for r in json.loads(out.read_text())["summary"]}
    assert rows["acespec-gap"]["gap_ms_per_token"] > 0
    assert rows["acespec"]["gap_ms_per_token"] == 0
    n = len(load_prompts(per_category=1))
    assert rows["acespec-gap"]["same_as_ar"] == rows["acespec"]["same_as_ar"] == f"{n}/{n}"
    assert "gap_ms_per_token" in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_rivals_beside_acespec_from_the_command_line(tiny_pair, tiny_hf_dir, tmp_path,
                                                         temperature):
    """`acespec bench --modes ar,colo,cloud-lookup,acespec`, greedy and coupled: the rivals
    give ar's text; in them the edge drafts nothing, and colo's tokens come from the
    verifier's drafter; every mode reports the verifier's seconds per 1k tokens and where
    its tokens came from."""
    import json
    import subprocess
    import sys

    _, _, ggufs = tiny_pair
    out = tmp_path / "rivals.json"
    p = subprocess.run([sys.executable, "-P", "-m", "acespec", "bench", "--model",
                        str(tiny_hf_dir), "--drafter", str(ggufs["q8_0"]), "--modes",
                        "ar,colo,cloud-lookup,acespec", "--per-category", "1", "--max-tokens",
                        "12", "--link", "loopback", "--emulate-step-ms", "5,0.1",
                        "--emulate-cloud-draft-ms", "1,0.01", "--temperature",
                        str(temperature), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {r["mode"]: r for r in json.loads(out.read_text())["summary"]}
    n = len(load_prompts(per_category=1))
    for mode in ("colo", "cloud-lookup", "acespec"):
        assert rows[mode]["same_as_ar"] == f"{n}/{n}", mode
    for mode, row in rows.items():
        assert row["verifier_s_per_1k_tokens"] > 0, mode
        assert row["tokens_from_lone_passes"] <= row["tokens"], mode
    for mode in ("colo", "cloud-lookup"):
        assert rows[mode]["tokens_from_edge_drafts"] == 0
        assert rows[mode]["wire_bytes_up_per_token"] < rows["acespec"]["wire_bytes_up_per_token"]
    assert rows["colo"]["gap_ms_per_token"] > 0 and rows["cloud-lookup"]["gap_ms_per_token"] == 0
    assert rows["colo"]["tokens_from_proposals"] > 0
    assert rows["ar"]["tokens_from_lone_passes"] == rows["ar"]["tokens"]


def test_the_rivals_need_a_decided_session():
    with pytest.raises(ValueError, match="colo, cloud-lookup need greedy or coupled"):
        BenchConfig(links=parse_links("loopback"), modes=("ar", "colo", "cloud-lookup"),
                    temperature=0.8, sampling="exact", gap_drafter="x.gguf")


@pytest.mark.slow
def test_bench_runs_the_verifier_in_the_dtype_asked_for_every_mode(tiny_pair, tiny_hf_dir,
                                                                  tmp_path):
    """`acespec bench --dtype bfloat16`: one verifier in bfloat16 serves `ar` and `acespec`
    alike (the profile line says so). Their texts are not compared: a bfloat16 pass's logits
    depend on how many tokens it scores, so greedy ties can break apart (docs/benchmarks.md
    §5); the column reports it."""
    import json
    import subprocess
    import sys

    _, _, ggufs = tiny_pair
    out = tmp_path / "bf16.json"
    p = subprocess.run([sys.executable, "-m", "acespec", "bench", "--model", str(tiny_hf_dir),
                        "--drafter", str(ggufs["q8_0"]), "--modes", "ar,acespec",
                        "--per-category", "1", "--max-tokens", "12", "--link", "loopback",
                        "--emulate-step-ms", "5,0.1", "--dtype", "bfloat16", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "verifier bfloat16" in p.stdout
    rows = {r["mode"]: r for r in json.loads(out.read_text())["summary"]}
    n = len(load_prompts(per_category=1))
    assert rows["ar"]["tokens"] == rows["acespec"]["tokens"] == 12 * n
    assert rows["acespec"]["same_as_ar"].endswith(f"/{n}")
    bad = subprocess.run([sys.executable, "-m", "acespec", "bench", "--dtype", "int3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--dtype" in bad.stderr and "int3" in bad.stderr


def test_bench_through_a_trace_and_an_outage_loses_nothing(tiny_pair, tiny_hf_dir, tmp_path):
    """`acespec bench --link trace:lte,RATE:RTT+outage=...`: each prompt's run starts at its
    own point of the link's cycle (here two runs start inside the outage and one inside the
    trace's gap), no mode loses a token, the decided modes give ar's text, and acespec-local
    answers part of it unverified while the link is down."""
    import json
    import subprocess
    import sys

    _, _, ggufs = tiny_pair
    out = tmp_path / "trace.json"
    p = subprocess.run([sys.executable, "-P", "-m", "acespec", "bench", "--model",
                        str(tiny_hf_dir), "--drafter", str(ggufs["q8_0"]), "--modes",
                        "ar,acespec,acespec-local", "--per-category", "1", "--max-tokens",
                        "24", "--link", "trace:lte,200kbit:50ms+outage=1:3",
                        "--emulate-step-ms", "20", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(out.read_text())
    n = len(load_prompts(per_category=1))
    for row in result["summary"]:
        assert row["tokens_lost"] == 0 and row["longest_gap_s"] is not None, row
        if row["mode"] != "ar":
            assert row["same_as_ar"] == f"{n}/{n}", row
    local = [r for r in result["runs"] if r["mode"] == "acespec-local"]
    assert sum(r["outages"] for r in local) >= 3  # 2 runs start in the outage, 1 in the gap
    assert any(r["unverified_tokens"] for r in local)
    assert all(r["error"] is None for r in result["runs"])


def test_netns_bench_refuses_links_that_change_in_time():
    from acespec.sim.bench import BenchConfig, parse_links

    with pytest.raises(ValueError, match="--netns"):
        BenchConfig(links=parse_links("trace:lte"), netns=True)
