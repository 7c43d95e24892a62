"""guidellm, the vLLM project's benchmarking tool, against `acespec edge serve` started from
the shell, in acespec mode and in ar mode on one verifier: 2 streams, 8 requests each, every
one served (the server's own count), none failed in guidellm's, and its time-to-first-token,
inter-token-latency and throughput figures present.

guidellm pins a click release older than this project's, so it lives in its own virtual
environment over the project's (scripts/install.sh makes `.venv-guidellm`; ACESPEC_GUIDELLM
names another executable)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

import api_stack  # noqa: E402

from conftest import stdlib_texts  # noqa: E402

pytestmark = pytest.mark.slow
servers = api_stack.servers  # the stack's fixture
ROOT = Path(__file__).resolve().parents[2]
GUIDELLM = Path(os.environ.get("ACESPEC_GUIDELLM", ROOT / ".venv-guidellm" / "bin" / "guidellm"))


def run_guidellm(url: str, data: Path, tokenizer: Path, out: Path) -> dict:
    cmd = [str(GUIDELLM), "run", "--backend",
           f"kind=openai_http,target={url},model=acespec,request_format=/v1/chat/completions",
           "--profile", "kind=concurrent,streams=2",
           "--constraint", "kind=max_requests,count=8",
           "--data", f"kind=json_file,path={data}",
           "--tokenizer", f"kind=hf_auto,model={tokenizer}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_guidellm_runs_against_edge_serve_in_both_modes(servers, tmp_path, tiny_hf_dir):
    assert GUIDELLM.is_file(), f"no guidellm at {GUIDELLM}: run scripts/install.sh"
    data = tmp_path / "prompts.jsonl"
    lines = [ln.strip() for t in stdlib_texts(4) for ln in t.splitlines() if len(ln) > 20][:8]
    data.write_text("".join(json.dumps({"prompt": p, "output_tokens_count": 16}) + "\n"
                            for p in lines))
    rows = {}
    for mode, url in servers.items():
        before = chat_answers(url)
        m = run_guidellm(url, data, tiny_hf_dir, tmp_path / f"{mode}.json")["benchmarks"][0][
            "metrics"]
        served = {status: n - before.get(status, 0) for status, n in chat_answers(url).items()}
        assert {s: n for s, n in served.items() if n} == {"200": 8}, (mode, served)
        # guidellm counts the requests that overlap its measured window, whose end a loaded
        # machine can place before the last one or two: of those it counted, none may fail.
        totals = m["request_totals"]
        assert totals["errored"] == totals["incomplete"] == 0, (mode, totals)
        assert 6 <= totals["successful"] == totals["total"] <= 8, (mode, totals)
        rows[mode] = summary(m)
        assert rows[mode]["output_tok_s"] > 0 and rows[mode]["itl_ms_p50"] > 0, rows[mode]
    print(json.dumps(rows))


def chat_answers(url: str) -> dict[str, float]:
    """The edge server's count of chat completions answered, by HTTP status, from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.labels["status"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "acespec_edge_requests_total" and s.labels["endpoint"] == "chat"}


def summary(m: dict) -> dict:
    """guidellm's figures a reader compares: TTFT, ITL (medians), output tokens per second."""
    def median(name: str) -> float:
        return round(m[name]["successful"]["median"], 2)
    return {"ttft_ms_p50": median("time_to_first_token_ms"),
            "itl_ms_p50": median("inter_token_latency_ms"),
            "output_tok_s": median("output_tokens_per_second")}
