"""--offline from the command line, with the demo pair (its drafter often disagrees with its
target, so an unverified span is replaced, not only confirmed) and a verifier that is
killed mid-answer and restarted:

* `edge generate --offline local`: the text equals cloud-only decoding's (greedy), and the
  answer kept coming while the verifier was down, unverified;
* `edge serve`, local, streaming: every unverified piece is flagged, arrives within 0.5 s of
  the link-down note, and following the acespec fields (confirmed, replace) gives exactly
  the verified text; not streaming, the text is the verified text;
* `edge serve`, wait: the stream pauses with SSE keep-alive comments, /health says degraded,
  and the text is the uninterrupted text;
* local, the verifier never back: the answer ends, its unverified tail flagged as such.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from offline_client import Client, follow  # noqa: E402

from cli_harness import Proc, acespec, verifier_at, wait_http  # noqa: E402
from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow
PROMPT = "def fibonacci(n):"
BODY = {"model": "acespec", "prompt": PROMPT, "max_tokens": 150, "ignore_eos": True,
        "temperature": 0}


def _reference(cport: int) -> str:
    """Cloud-only decoding's text for PROMPT (greedy)."""
    r = acespec("edge", "generate", PROMPT, "--cloud", f"127.0.0.1:{cport}", "--mode", "ar",
                "--max-tokens", "150", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["text"]


def test_generate_local_keeps_answering_and_ends_on_the_verified_text():
    cport = free_port()
    cloud = verifier_at(cport, "--emulate-step-ms", "60")
    try:
        ref = _reference(cport)
        with Proc("edge", "generate", PROMPT, "--cloud", f"127.0.0.1:{cport}", "--offline",
                  "local", "--max-tokens", "150", "--json") as edge:
            time.sleep(1.5)  # mid-answer (150 tokens take ~4 s at 60 ms a pass)
            cloud.kill()
            edge.wait_for(r"answering locally, unverified", timeout=20)
            time.sleep(2)
            cloud = verifier_at(cport, "--emulate-step-ms", "60")
            assert edge.p.wait(120) == 0, edge.stderr
            out, err = json.loads(edge.stdout), edge.stderr
    finally:
        cloud.kill()
    s = out["stats"]
    assert out["text"] == ref
    assert s["outages"] == 1 and s["offline_s"] > 2
    assert s["unverified_tokens"] > 0 and s["unverified_replaced"] > 0
    assert s["unverified_confirmed"] + s["unverified_replaced"] == s["unverified_tokens"]
    assert "verifier back after" in err and "Traceback" not in err


@pytest.fixture
def served(request):
    """(edge URL, verifier port, restart(), kill()) with a verifier at 60 ms a pass; the
    edge's reconnect deadline is the test's `deadline` marker's, else 30 s."""
    marker = request.node.get_closest_marker("deadline")
    cport, eport = free_port(), free_port()
    procs = {"cloud": verifier_at(cport, "--emulate-step-ms", "60")}
    url = f"http://127.0.0.1:{eport}"
    with Proc("edge", "serve", "--cloud", f"127.0.0.1:{cport}", "--port", str(eport),
              "--reconnect-deadline", str(marker.args[0] if marker else 30)) as edge:
        edge.wait_for(r"acespec edge listening")
        wait_http(f"{url}/health")

        def restart():
            procs["cloud"] = verifier_at(cport, "--emulate-step-ms", "60")

        yield url, cport, restart, lambda: procs["cloud"].kill()
        edge.stop(timeout=20)
    procs["cloud"].kill()


def _post_local(url: str) -> tuple[threading.Thread, dict]:
    """A non-streamed local-mode request in a thread; its response lands in box["r"]."""
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(r=httpx.post(
        f"{url}/v1/completions", json={**BODY, "offline": "local"}, timeout=120)))
    t.start()
    return t, box


def _ref_stream(url: str) -> str:
    r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_serve_local_stream_flags_every_unverified_piece_and_settles_it(served):
    url, _, restart, kill = served
    ref = _ref_stream(url)
    client = Client(url, {**BODY, "stream": True, "offline": "local",
                          "stream_options": {"include_usage": True}})
    client.start()
    client.wait_texts(5)
    kill()
    time.sleep(2.5)
    restart()
    client.join(120)
    assert client.lines[-1][1] == "data: [DONE]", client.lines[-5:]
    chunks = [c for _, c in client.chunks()]
    assert follow(chunks) == (ref, "")
    down = [t for t, x in client.lines if x.startswith(": verifier unreachable")]
    first = [t for t, c in client.chunks()
             if c.get("choices") and c["choices"][0].get("acespec", {}).get("unverified")]
    assert down and first and first[0] - down[0] < 0.5
    assert any(x.startswith(": verifier back after") for _, x in client.lines)
    usage = chunks[-1]["usage"]
    assert usage["outages"] == 1 and usage["unverified_replaced"] > 0  # the pair disagrees
    assert usage["unverified_confirmed"] + usage["unverified_replaced"] \
        == usage["unverified_tokens"]
    flagged = sum(len(c["choices"][0]["text"]) for c in chunks if c.get("choices")
                  and c["choices"][0].get("acespec", {}).get("unverified"))
    assert flagged > 0
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'acespec_edge_unverified_tokens_total{fate="replaced"}' in metrics


def test_serve_local_without_stream_answers_the_verified_text(served):
    url, _, restart, kill = served
    ref = _ref_stream(url)
    t, box = _post_local(url)
    time.sleep(1.0)
    kill()
    time.sleep(2)
    restart()
    t.join(120)
    body = box["r"].json()
    assert box["r"].status_code == 200, body
    assert body["choices"][0]["text"] == ref and "acespec" not in body["choices"][0]
    assert body["usage"]["outages"] == 1 and body["usage"]["unverified_left"] == 0


def test_serve_wait_pauses_with_keepalives_and_health_says_degraded(served):
    url, _, restart, kill = served
    ref = _ref_stream(url)
    client = Client(url, {**BODY, "stream": True})
    client.start()
    client.wait_texts(5)
    kill()
    time.sleep(2.5)
    health = httpx.get(f"{url}/health", timeout=10).json()
    restart()
    client.join(120)
    assert health["status"] == "degraded" and health["link"] == "down", health
    assert client.lines[-1][1] == "data: [DONE]", client.lines[-5:]
    assert sum(x == ": keep-alive" for _, x in client.lines) >= 2
    assert not any(c["choices"][0].get("acespec") for _, c in client.chunks()
                   if c.get("choices"))
    assert follow([c for _, c in client.chunks()]) == (ref, "")
    assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"


@pytest.mark.deadline(3)
def test_serve_local_ends_on_a_flagged_unverified_tail_when_the_verifier_never_returns(
        served):
    url, _, _, kill = served
    t, box = _post_local(url)
    time.sleep(1.0)
    kill()
    t.join(120)
    body = box["r"].json()
    assert box["r"].status_code == 200, body
    ch = body["choices"][0]
    start = ch["acespec"]["unverified_from"]
    assert 0 < start < len(ch["text"])
    assert body["usage"]["unverified_left"] > 0
    assert body["usage"]["completion_tokens"] + body["usage"]["unverified_left"] == 150


@pytest.mark.parametrize("mode", ["ar", "colo"])
def test_local_without_a_drafter_is_a_usage_error(mode):
    r = acespec("edge", "generate", "x", "--mode", mode, "--offline", "local", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("acespec edge generate: error: --offline local answers from "
                                f"the drafter, and --mode {mode} drafts nothing at the edge")
