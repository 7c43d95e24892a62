"""`acespec bench hostile` from the command line: an honest `edge generate` beside a client
that wastes every node it sends, beside two that open sessions on 4,000-token prompts,
beside one constrained by a 3,000-property JSON schema, beside four that score 2,000-token
prompts for their logprobs, and beside one client with 50 sessions, on one verifier with the
40,0.5 step profile. The honest client's rate beside each is a ratio against its alone rate
measured in the same run; the bounds are loose (the machine is shared), but a verifier
without earned shares, chunked prefill and prompt scoring, grammar work off its loops and a
share per client falls far below them. The verifier's memory after each comes back within
300 MB of where it was alone."""

from __future__ import annotations

import json

import pytest

from cli_harness import acespec

pytestmark = pytest.mark.slow

WASTE_BOUND = 0.4  # the benchmark's target is 0.5 (docs/benchmarks.md)
LONG_BOUND = 0.4  # ... and 0.6
STREAMS_BOUND = 0.35  # ... and 0.5
# ... and 0.5: the schema's mask work runs in the verifier's grammar threads, on the same two
# cores as the honest edge and the passes (0.28 was seen on a busy CI machine); a verifier
# whose passes stall on a grammar gives the honest client 0.02-0.05x
SCHEMA_BOUND = 0.2
ECHO_BOUND = 0.2  # ... and 0.3
RSS_MB = 300
GAP_S = 2.0  # the honest client's longest wait between two tokens (the target: 1 s)
SCENARIOS = ("alone", "waste1", "long2", "schema1", "echo4", "streams50")


def test_hostile_bench_keeps_the_honest_client_going(tmp_path):
    out = tmp_path / "hostile.json"
    r = acespec("bench", "hostile", "--scenarios", ",".join(SCENARIOS), "--max-tokens", "32",
                "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| scenario | honest tok/s | vs alone |" in r.stdout
    rows = {row["scenario"]: row for row in json.loads(out.read_text())["runs"]}
    print(r.stdout)
    assert set(rows) == set(SCENARIOS)
    assert all(row["runs"] == 5 and row["honest_tok_s"] > 0 for row in rows.values())
    assert rows["waste1"]["vs_alone"] >= WASTE_BOUND
    assert rows["long2"]["vs_alone"] >= LONG_BOUND
    assert rows["schema1"]["vs_alone"] >= SCHEMA_BOUND
    assert rows["echo4"]["vs_alone"] >= ECHO_BOUND
    assert rows["streams50"]["vs_alone"] >= STREAMS_BOUND
    assert all(0 < row["longest_gap_s"] <= GAP_S for row in rows.values()), rows
    alone_mb = rows["alone"]["verifier_rss_mb"]
    assert all(row["verifier_rss_mb"] <= alone_mb + RSS_MB for row in rows.values()), rows


def test_an_unknown_scenario_is_one_line():
    r = acespec("bench", "hostile", "--scenarios", "alone,flood3", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "acespec bench: error: unknown scenario 'flood3': alone, peerN, wasteN, longN, "
        "schemaN, echoN (N clients, default 1) or streamsN (one client, N sessions)"]
