"""The SmolLM2 pair end to end, started from the command line as a user would:
`acespec cloud serve --pair smollm2` and `acespec edge serve --pair smollm2`, then a chat
completion over HTTP. Greedy decoding is lossless, so the answer must equal cloud-only
decoding (`edge generate --mode ar`) of the same chat prompt through the same verifier.
"""

from __future__ import annotations

import json
import os

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("llama_cpp")
pytest.importorskip("torch")

from acespec import pairs  # noqa: E402

from cli_harness import Proc, acespec, wait_http  # noqa: E402
from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow
QUESTION = "Write a Python function that checks whether a number is prime."
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def env(smollm2_cache):
    return {"ACESPEC_CACHE_DIR": str(smollm2_cache)}


@pytest.fixture(scope="module")
def cloud(env):
    with Proc("cloud", "serve", "--pair", "smollm2", "--host", "127.0.0.1", "--port", "0",
              env=env) as proc:
        yield proc.wait_for(r"listening on ([\d.]+:\d+)", timeout=180).group(1)


def test_fetch_reuses_the_cache(env):
    out = acespec("models", "fetch", "smollm2", env={**os.environ, **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "fetching" not in out.stderr and "converting" not in out.stderr
    assert f"{env['ACESPEC_CACHE_DIR']}/smollm2/target" in out.stdout


def test_pair_and_model_clash_is_one_line(env):
    out = acespec("cloud", "serve", "--pair", "smollm2", "--model", "/x", env={**os.environ, **env},
                  timeout=60)
    assert out.returncode == 2 and "--pair smollm2 sets --model" in out.stderr, out.stderr


@pytest.mark.slow
def test_chat_completion_through_edge_serve(env, cloud, monkeypatch):
    monkeypatch.setenv("ACESPEC_CACHE_DIR", env["ACESPEC_CACHE_DIR"])
    port = free_port()
    # The default: greedy, so the verifier decides and the edge grows its speculation tree
    # (with the distilled drafter; the 135M Q4_1 as its own drafter is drafting-bound here).
    with Proc("edge", "serve", "--pair", "smollm2", "--cloud", cloud, "--port", str(port),
              "--max-concurrent", "1", "--ctx-per-request", "512",
              env=env) as edge:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300, json={
            "model": "acespec", "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": MAX_TOKENS, "temperature": 0})
        assert r.status_code == 200, r.text
        assert "smollm2 drafter" in edge.stderr
    body = r.json()
    text = body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] == MAX_TOKENS or \
        body["choices"][0]["finish_reason"] == "stop"
    prompt = pairs.render_chat(pairs.chat_template("smollm2"), QUESTION)
    ar = acespec("edge", "generate", "--pair", "smollm2", "--cloud", cloud, "--mode", "ar",
                 "--max-tokens", str(MAX_TOKENS), "--json", prompt, env={**os.environ, **env})
    assert ar.returncode == 0, ar.stderr
    print(f"chat answer: {text!r}")
    assert text == json.loads(ar.stdout)["text"]
    assert "def " in text and "prime" in text  # SmolLM2 answers with a Python function
