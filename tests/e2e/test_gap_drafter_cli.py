"""`acespec cloud serve --gap-drafter FILE` as a user runs it: the edge's own drafter GGUF
on the verifier proposes in lone passes, the text stays cloud-only decoding's, and the
stats say what it proposed and what it cost; a wrong file is one line and exit 2."""

from __future__ import annotations

import urllib.request

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.models import DEMO_DRAFTER  # noqa: E402

from cli_harness import acespec, generate_json, scrape, verifier  # noqa: E402
from conftest import free_port  # noqa: E402

PROMPT = "def fibonacci(n):"


@pytest.mark.slow
def test_a_gap_drafter_proposes_in_lone_passes_and_changes_no_token():
    mport = free_port()
    cloud, addr = verifier("--gap-drafter", str(DEMO_DRAFTER), "--metrics-port", str(mport))
    with cloud:
        runs = {mode: generate_json(addr, PROMPT, "--mode", mode, "--max-tokens", "48")
                for mode in ("ar", "acespec-gap")}
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10
                                         ).read().decode()
        cloud.stop()
        log = cloud.stderr
    assert "gap drafter drafter-q8_0.gguf" in log
    assert runs["ar"]["token_ids"] == runs["acespec-gap"]["token_ids"]
    assert len(runs["ar"]["token_ids"]) == 48
    st = runs["acespec-gap"]["stats"]
    assert st["verifier_proposed"] > 0 and st["gap_s"] > 0, st
    assert st["lone_tokens"] > st["lone_passes"]  # lone passes decide more than one token
    # Where the drafter does not pay, prompt lookup proposes instead (source="lookup").
    scored = sum(scrape(metrics, "acespec_proposals_total", source=src, fate="scored")
                 for src in ("gap", "lookup"))
    taken = sum(scrape(metrics, "acespec_proposals_total", source=src, fate="accepted")
                for src in ("gap", "lookup"))
    assert scored == st["verifier_proposed"] and taken == st["proposed_accepted"]
    assert scrape(metrics, "acespec_proposals_total", source="gap", fate="scored") > 0
    assert scrape(metrics, "acespec_gap_seconds_total") == pytest.approx(st["gap_s"], abs=1e-3)


@pytest.mark.parametrize("path, words", [
    ("models/smollm2/drafter-q8_0.gguf", ["--gap-drafter", "tokenizer", "target's"]),
    ("/nonexistent/d.gguf", ["--gap-drafter", "no such file"]),
])
@pytest.mark.slow
def test_a_wrong_gap_drafter_is_one_line_and_exit_2(path, words):
    p = acespec("cloud", "serve", "--port", "0", "--gap-drafter", path, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    err = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and all(w in err[0] for w in words), p.stderr[-2000:]
    assert "Traceback" not in p.stderr
