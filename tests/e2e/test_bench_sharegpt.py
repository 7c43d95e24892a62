"""`acespec bench --dataset sharegpt` from the command line: real chats of the evaluation
split, rendered with the pair's template, reported per category and overall."""

from __future__ import annotations

import json
import os

import pytest

from cli_harness import acespec

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.slow


@pytest.mark.slow
def test_bench_sharegpt_eval_split_per_category(chat_cache, tmp_path):
    out = tmp_path / "bench.json"
    r = acespec("bench", "--pair", "smollm2", "--dataset", "sharegpt", "--per-category", "1",
                "--max-tokens", "8", "--modes", "ar,acespec", "--emulate-step-ms", "0",
                "--link", "1mbit:10ms", "--out", str(out), timeout=600,
                env={**os.environ, "ACESPEC_CACHE_DIR": str(chat_cache)})
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert {x["category"] for x in runs} == {"code", "writing", "explain", "other"}
    assert all(int(x["prompt"].removeprefix("sharegpt-")) >= 12000 for x in runs)  # eval split
    assert {(c["mode"], c["category"]) for c in data["by_category"]} == {
        (m, c) for m in ("ar", "acespec") for c in ("code", "writing", "explain", "other")}
    by = {(x["mode"], x["prompt"]): x for x in runs}
    prompts = {x["prompt"] for x in runs}
    assert len(prompts) == 4
    # Greedy: speculation changes speed, never the text.
    assert all(by[("ar", p)]["token_ids"] == by[("acespec", p)]["token_ids"] for p in prompts)
    assert "per category:" in r.stdout
    assert all(x["same_as_ar"] == "4/4" for x in data["summary"] if x["mode"] == "acespec")


def test_bench_sharegpt_without_a_template_is_one_line(tmp_path):
    r = acespec("bench", "--pair", "demo", "--dataset", "sharegpt", timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("acespec bench: error: --dataset sharegpt "
                                                        "needs a chat template")
