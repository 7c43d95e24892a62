"""--offline through a real emulated link that goes down, from the command line: the link
emulator (`acespec sim link --outage START:DURATION`, 50 kbit/s, 50 ms) between the edge and
the verifier, with the demo pair.

* at the start, mid-answer for 5 s, flapping: `edge generate` in both modes ends on
  cloud-only decoding's text; local answered meanwhile;
* at the start, 4 s: `edge serve` in wait mode keeps the stream alive with keep-alives and
  answers the uninterrupted text; in local mode it answers unverified first;
* the same outages for `edge serve`, streamed and not, in both modes: the verified text is
  cloud-only decoding's;
* flapping, 3 drops in 20 s: a local stream flags every unverified piece, each outage's
  first one within 0.5 s of its link-down note, and settles to the verified text.
"""

from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from offline_client import Client, follow  # noqa: E402

from cli_harness import Proc, acespec, wait_http  # noqa: E402
from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow
PROMPT = "def fibonacci(n):"
STEP = ("--emulate-step-ms", "40")


@pytest.fixture(scope="module")
def verifier():
    """(port, {max_tokens: cloud-only text}) of one verifier for the module."""
    port = free_port()
    with Proc("cloud", "serve", "--host", "127.0.0.1", "--port", str(port), *STEP) as p:
        p.wait_for(r"listening on")
        refs = {}

        def ref(n: int) -> str:
            if n not in refs:
                r = acespec("edge", "generate", PROMPT, "--cloud", f"127.0.0.1:{port}",
                            "--mode", "ar", "--max-tokens", str(n), "--json", timeout=180)
                assert r.returncode == 0, r.stderr
                refs[n] = json.loads(r.stdout)["text"]
            return refs[n]
        yield port, ref


def _link(port: int, *outages: str, listen: int | None = None) -> tuple[Proc, int]:
    """The link emulator in front of the verifier, its outage clock started now."""
    listen = listen or free_port()
    p = Proc("sim", "link", "--listen", f"127.0.0.1:{listen}", "--to", f"127.0.0.1:{port}",
             "--up", "50kbit", "--down", "50kbit", "--rtt", "50ms",
             *(x for o in outages for x in ("--outage", o)))
    p.wait_for(r"acespec link")
    return p, listen


OUTAGES = {"at the start": ("0:4",), "mid-answer, 5 s": ("4:5",),
           "flapping, 3 in 20 s": ("3:1.5", "6.5:1.5", "10:1.5")}


@pytest.mark.parametrize("offline", ["wait", "local"])
@pytest.mark.parametrize("outages", OUTAGES.values(), ids=OUTAGES.keys())
def test_generate_rides_out_the_link_going_down(verifier, offline, outages):
    port, ref = verifier
    link, listen = _link(port, *outages)
    with link, Proc("edge", "generate", PROMPT, "--cloud", f"127.0.0.1:{listen}",
                    "--offline", offline, "--max-tokens", "300", "--json") as edge:
        assert edge.p.wait(180) == 0, edge.stderr
        out, err = json.loads(edge.stdout), edge.stderr
    s = out["stats"]
    assert out["text"] == ref(300), err
    if offline == "local":
        assert s["outages"] >= 1 and s["unverified_tokens"] > 0, s
        assert s["unverified_confirmed"] + s["unverified_replaced"] == s["unverified_tokens"]
    assert "Traceback" not in err


@pytest.fixture
def edge_serve(verifier):
    """Start `edge serve` behind a link with the given outages, the link's clock started
    once the edge listens (so an outage at 0 s meets the first request): returns its URL."""
    port, _ = verifier
    started = []

    def start(*outages: str) -> str:
        eport, listen = free_port(), free_port()
        edge = Proc("edge", "serve", "--cloud", f"127.0.0.1:{listen}", "--port", str(eport))
        started.append(edge)
        edge.wait_for(r"acespec edge listening")
        started.append(_link(port, *outages, listen=listen)[0])
        url = f"http://127.0.0.1:{eport}"
        wait_http(f"{url}/health")
        return url
    yield start
    for p in started:
        p.__exit__()


BODY = {"model": "acespec", "prompt": PROMPT, "ignore_eos": True, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}}


def test_serve_wait_through_an_outage_at_the_start_keeps_the_stream_alive(verifier,
                                                                          edge_serve):
    _, ref = verifier
    url = edge_serve("0:6")
    client = Client(url, {**BODY, "max_tokens": 60})
    client.run()
    assert client.lines[-1][1] == "data: [DONE]", client.lines[-5:]
    assert follow([c for _, c in client.chunks()]) == (ref(60), "")
    first_text = next(t for t, c in client.chunks() if c.get("choices")
                      and c["choices"][0]["text"])
    alive = [t for t, x in client.lines if x == ": keep-alive" and t < first_text]
    assert len(alive) >= 2, client.lines[:8]


def test_serve_local_through_an_outage_at_the_start_answers_unverified_first(verifier,
                                                                            edge_serve):
    _, ref = verifier
    url = edge_serve("0:6")
    client = Client(url, {**BODY, "max_tokens": 60, "offline": "local"})
    t0 = time.monotonic()
    client.run()
    assert client.lines[-1][1] == "data: [DONE]", client.lines[-5:]
    chunks = [c for _, c in client.chunks()]
    assert follow(chunks) == (ref(60), "")
    first = next(c for c in chunks if c.get("choices") and c["choices"][0]["text"])
    assert first["choices"][0]["acespec"] == {"unverified": True}
    assert client.lines[0][0] - t0 < 3  # answering long before the link is back


def test_serve_local_through_a_flapping_link_flags_and_settles_every_outage(verifier,
                                                                           edge_serve):
    _, ref = verifier
    url = edge_serve("4:1.5", "7.5:1.5", "11:1.5")  # 3 drops in 20 s
    client = Client(url, {**BODY, "max_tokens": 400, "offline": "local"})
    client.run()
    took = client.lines[-1][0] - client.lines[0][0]
    assert client.lines[-1][1] == "data: [DONE]", client.lines[-5:]
    chunks = client.chunks()
    assert follow([c for _, c in chunks]) == (ref(400), "")
    print(f"400 tokens in {took:.1f} s")
    downs = [t for t, x in client.lines if x.startswith(": verifier unreachable")]
    unverified = [t for t, c in chunks if c.get("choices")
                  and c["choices"][0].get("acespec", {}).get("unverified")]
    assert len(downs) >= 2, (took, [x for _, x in client.lines if x.startswith(":")])
    waits = []  # from each outage flagged to the first unverified token after it
    for t in downs:
        after = [u for u in unverified if u >= t]
        assert after, (t, unverified)
        waits.append(after[0] - t)
    assert max(waits) < 1.5 and sorted(waits)[len(waits) // 2] < 0.5, waits  # a stall: once
    usage = chunks[-1][1]["usage"]
    assert usage["outages"] == len(downs)
    assert usage["unverified_confirmed"] + usage["unverified_replaced"] \
        == usage["unverified_tokens"] > 0
    assert re.search(r'acespec_edge_link_outages_total \d', httpx.get(
        f"{url}/metrics", timeout=10).text)


@pytest.mark.parametrize("offline", ["wait", "local"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("outages", OUTAGES.values(), ids=OUTAGES.keys())
def test_serve_rides_out_the_link_going_down(verifier, edge_serve, offline, stream, outages):
    """Every outage, streamed or not, in both modes: the verified text is cloud-only
    decoding's, and a stream's acespec fields settle to exactly it."""
    _, ref = verifier
    url = edge_serve(*outages)
    body = {**BODY, "stream": stream, "max_tokens": 300, "offline": offline}
    if stream:
        client = Client(url, body)
        client.run()
        assert client.lines[-1][1] == "data: [DONE]", client.lines[-5:]
        chunks = [c for _, c in client.chunks()]
        assert follow(chunks) == (ref(300), "")
        usage = chunks[-1]["usage"]
    else:
        del body["stream_options"]
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["choices"][0]["text"] == ref(300) and "acespec" not in out["choices"][0]
        usage = out["usage"]
    assert usage["unverified_left"] == 0
    if offline == "local":
        assert usage["outages"] >= 1, usage
