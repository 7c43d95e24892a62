"""`acespec bench hostile` from the command line: an honest `edge generate` beside a client
that wastes every node it sends and beside two that open sessions on 4,000-token prompts,
on one verifier with the 40,0.5 step profile. The honest client's rate beside each is a
ratio against its alone rate measured in the same run; the bounds are loose (the machine is
shared), but a verifier without earned shares and chunked prefill falls far below them: a
waster's 256-node passes and a 4,000-token prefill in one pass stall everyone."""

from __future__ import annotations

import json

import pytest

from cli_harness import acespec

pytestmark = pytest.mark.slow

WASTE_BOUND = 0.4  # the benchmark's target is 0.5 (docs/benchmarks.md)
LONG_BOUND = 0.4  # ... and 0.6


def test_hostile_bench_keeps_the_honest_client_going(tmp_path):
    out = tmp_path / "hostile.json"
    r = acespec("bench", "hostile", "--scenarios", "alone,waste1,long2", "--max-tokens", "32",
                "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| scenario | honest tok/s | vs alone |" in r.stdout
    rows = {row["scenario"]: row for row in json.loads(out.read_text())["runs"]}
    print(r.stdout)
    assert set(rows) == {"alone", "waste1", "long2"}
    assert all(row["runs"] == 5 and row["honest_tok_s"] > 0 for row in rows.values())
    assert rows["waste1"]["vs_alone"] >= WASTE_BOUND
    assert rows["long2"]["vs_alone"] >= LONG_BOUND


def test_an_unknown_scenario_is_one_line():
    r = acespec("bench", "hostile", "--scenarios", "alone,flood3", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "acespec bench: error: unknown scenario 'flood3': alone, peerN, wasteN or longN "
        "(N clients, default 1)"]
