"""`edge serve` from the command line through a verifier restart and a SIGTERM: an in-flight
stream resumes on the new verifier with exactly its text, /health and /ready say the
verifier is down meanwhile (a new request gets 503), a new request finds the verifier as
soon as it is back, and SIGTERM ends open streams at once with an error and [DONE]."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from cli_harness import Proc, wait_http  # noqa: E402
from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow
REQ = {"model": "acespec", "prompt": "import os", "max_tokens": 120, "stream": True,
       "ignore_eos": True, "temperature": 0}


def _cloud(model_dir, port: int, *extra: str) -> Proc:
    p = Proc("cloud", "serve", "--model", str(model_dir), "--host", "127.0.0.1", "--port",
             str(port), *extra)
    p.wait_for(r"listening on")
    return p


def _stream(url: str, got: list[str], body=REQ) -> threading.Thread:
    def client():
        try:
            with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json=body) as r:
                got.extend(x for x in r.iter_lines() if x)
        except httpx.HTTPError as e:
            got.append(f"error: {e}")
    t = threading.Thread(target=client, daemon=True)
    t.start()
    return t


def _text(lines: list[str]) -> str:
    return "".join(json.loads(x[6:])["choices"][0]["text"] for x in lines
                   if x.startswith("data: {") and json.loads(x[6:]).get("choices"))


def _wait_chunks(got: list[str], n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while sum(x.startswith("data: {") for x in got) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sum(x.startswith("data: {") for x in got) >= n, got[-5:]


@pytest.mark.slow
def test_stream_rides_out_a_verifier_restart(tiny_pair, tiny_hf_dir):
    cport, eport = free_port(), free_port()
    url = f"http://127.0.0.1:{eport}"
    cloud = _cloud(tiny_hf_dir, cport)
    with Proc("edge", "serve", "--cloud", f"127.0.0.1:{cport}", "--port", str(eport),
              "--drafter", str(tiny_pair[2]["q8_0"]), "--reconnect-deadline", "30") as edge:
        edge.wait_for(r"acespec edge listening")
        wait_http(f"{url}/health")
        ref: list[str] = []
        _stream(url, ref).join(120)  # the uninterrupted text
        assert ref[-1] == "data: [DONE]", ref[-3:]
        cloud.stop()
        cloud.__exit__()
        cloud = _cloud(tiny_hf_dir, cport, "--emulate-step-ms", "60")  # slow: time to kill it
        got: list[str] = []
        t = _stream(url, got)
        _wait_chunks(got, 4)
        cloud.p.kill()  # the verifier dies mid-stream
        cloud.p.wait()
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["verifier"] == "unreachable"
        assert httpx.get(f"{url}/ready", timeout=10).status_code == 503
        time.sleep(3)  # a restart takes a while
        t0 = time.monotonic()
        down = httpx.post(f"{url}/v1/completions", timeout=30, json={**REQ, "stream": False})
        assert down.status_code == 503 and time.monotonic() - t0 < 4  # new requests: told
        cloud.__exit__()
        cloud = _cloud(tiny_hf_dir, cport)
        t0 = time.monotonic()  # the verifier is back: a new request finds it at once
        back = httpx.post(f"{url}/v1/completions", timeout=30, json={
            **REQ, "stream": False, "max_tokens": 4})
        # gRPC's own backoff would wait seconds more; CHANNEL_OPTIONS caps it at 0.5 s
        assert back.status_code == 200 and time.monotonic() - t0 < 3.0, back.text
        t.join(90)
        assert got[-1] == "data: [DONE]", got[-5:]
        assert not any('"error"' in x for x in got)
        assert _text(got) == _text(ref)  # resumed with the committed text: same tokens
        assert httpx.get(f"{url}/ready", timeout=10).status_code == 200
        edge.stop(timeout=20)
    cloud.stop()
    cloud.__exit__()


@pytest.mark.slow
def test_sigterm_ends_open_streams_with_an_error_and_done(tiny_pair, tiny_hf_dir):
    cport, eport = free_port(), free_port()
    url = f"http://127.0.0.1:{eport}"
    with _cloud(tiny_hf_dir, cport, "--emulate-step-ms", "40") as cloud, \
            Proc("edge", "serve", "--cloud", f"127.0.0.1:{cport}", "--port", str(eport),
                 "--drafter", str(tiny_pair[2]["q8_0"])) as edge:
        edge.wait_for(r"acespec edge listening")
        wait_http(f"{url}/health")
        got: list[str] = []
        t = _stream(url, got, {**REQ, "max_tokens": 2000})
        _wait_chunks(got, 3)
        code, took = edge.stop(signal.SIGTERM, timeout=20)
        t.join(20)
        assert took < 5, f"edge serve took {took:.1f} s to stop"
        assert got[-1] == "data: [DONE]", got[-3:]
        err = json.loads(got[-2][6:])["error"]
        assert err["code"] == "server_shutdown"
        cloud.stop()
