"""The edge's local OpenAI-compatible server: a real uvicorn server on a socket, real HTTP
clients (httpx and the official openai client), the real drafter and a real verifier."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from acespec.cli import build_parser  # noqa: E402
from acespec.cloud.serving.server import ServerConfig  # noqa: E402
from acespec.edge.api.app import create_app  # noqa: E402
from acespec.edge.api.openai_types import parse_request  # noqa: E402
from acespec.edge.commands import build_service  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from conftest import free_port  # noqa: E402
from verifier_harness import run, running_verifier  # noqa: E402

CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def chat_gguf(tiny_pair):
    from acespec.models.gguf_export import export_gguf

    tok_dir, model, _ = tiny_pair
    return export_gguf(model, tok_dir, tok_dir / "chat.gguf", "q8_0", chat_template=CHAT)


@contextlib.asynccontextmanager
async def edge_server(cloud: str, gguf, mode="pipeline"):
    args = build_parser().parse_args(["edge", "serve", "--drafter", str(gguf), "--mode", mode,
                                      "--depth", "3", "--window", "8", "--cloud", cloud,
                                      "--served-model-name", "tiny"])
    svc = build_service(args)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(svc), host="127.0.0.1", port=port,
                                           log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", svc
    finally:
        server.should_exit = True
        await task
        await svc.aclose()


def with_stack(tiny_pair, gguf, body, cfg=None):
    """Run body(http, base_url, svc, engine) against a verifier + edge server."""
    tok_dir, model, _ = tiny_pair
    vh = Tokenizer.load(tok_dir).vocab_hash()

    async def go():
        async with running_verifier(model, vh, cfg) as (engine, addr), \
                edge_server(addr, gguf) as (url, svc), \
                httpx.AsyncClient(base_url=url, timeout=60) as http:
            return await body(http, url, svc, engine)

    return run(go())


async def sse(http, path, payload):
    chunks = []
    async with http.stream("POST", path, json=payload) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


def test_completions_stream_equals_non_stream_and_usage(tiny_pair, chat_gguf):
    async def body(http, url, svc, engine):
        req = {"model": "tiny", "prompt": "import os\n", "max_tokens": 12, "temperature": 0}
        plain = (await http.post("/v1/completions", json=req)).json()
        events = await sse(http, "/v1/completions", {**req, "stream": True,
                                                     "stream_options": {"include_usage": True}})
        return plain, events

    plain, events = with_stack(tiny_pair, chat_gguf, body)
    assert plain["object"] == "text_completion" and plain["choices"][0]["finish_reason"] == "length"
    u = plain["usage"]
    assert u["completion_tokens"] == 12 and u["mean_acceptance_length"] >= 1
    assert u["passes"] >= 1 and "target_forwards" not in u
    for k in ("drafted_tokens", "accepted_tokens", "cache_hit_rate", "wire_bytes_up", "wire_bytes_down"):
        assert k in u
    streamed = "".join(c["text"] for e in events for c in e["choices"])
    assert streamed == plain["choices"][0]["text"]
    assert events[-1]["usage"]["completion_tokens"] == 12


def test_chat_stop_n_and_seeds(tiny_pair, chat_gguf):
    async def body(http, url, svc, engine):
        chat = await http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0})
        chat_stream = await sse(http, "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0, "stream": True})
        base = {"model": "tiny", "prompt": "def f(", "max_tokens": 10, "temperature": 1.0,
                "seed": 7, "n": 3}
        a = (await http.post("/v1/completions", json=base)).json()
        b = (await http.post("/v1/completions", json=base)).json()
        full = (await http.post("/v1/completions", json={
            "model": "tiny", "prompt": "def f(", "max_tokens": 10, "temperature": 0})).json()
        return chat.json(), chat_stream, a, b, full

    chat, chat_stream, a, b, full = with_stack(tiny_pair, chat_gguf, body)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    text = "".join(c["delta"].get("content", "") for e in chat_stream for c in e["choices"])
    assert text == chat["choices"][0]["message"]["content"]
    texts = [c["text"] for c in a["choices"]]
    assert len(texts) == 3 and len(set(texts)) > 1  # n choices, different seeds
    assert texts == [c["text"] for c in b["choices"]]  # seeded: reproducible
    assert full["choices"][0]["text"]


def test_stop_string(tiny_pair, chat_gguf):
    async def body(http, url, svc, engine):
        req = {"model": "tiny", "prompt": "x = 1\n", "max_tokens": 24, "temperature": 0}
        full = (await http.post("/v1/completions", json=req)).json()["choices"][0]["text"]
        stop = full[5:8]
        cut = (await http.post("/v1/completions", json={**req, "stop": [stop]})).json()
        events = await sse(http, "/v1/completions", {**req, "stop": stop, "stream": True})
        return full, stop, cut, events

    full, stop, cut, events = with_stack(tiny_pair, chat_gguf, body)
    expect = full[:full.find(stop)]
    assert cut["choices"][0]["text"] == expect and cut["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["text"] for e in events for c in e["choices"]) == expect


def test_concurrent_requests_equal_sequential(tiny_pair, chat_gguf):
    prompts = ["import sys\n", "class A:\n", "def g(x):\n", "for i in"]

    async def body(http, url, svc, engine):
        def req(p, t):
            return {"model": "tiny", "prompt": p, "max_tokens": 14, "temperature": t, "seed": 3}
        seq = [(await http.post("/v1/completions", json=req(p, t))).json()["choices"][0]["text"]
               for t in (0, 0.9) for p in prompts]
        par = await asyncio.gather(*(http.post("/v1/completions", json=req(p, t))
                                     for t in (0, 0.9) for p in prompts))
        return (seq, [r.json()["choices"][0]["text"] for r in par],
                svc.free_seqs.qsize() == svc.max_concurrent)

    seq, par, all_free = with_stack(tiny_pair, chat_gguf, body)
    assert seq == par and all_free


def test_disconnect_mid_stream_frees_everything(tiny_pair, chat_gguf):
    from acespec.cloud.verify.batcher import StepEmulation

    async def body(http, url, svc, engine):
        payload = {"model": "tiny", "prompt": "import", "max_tokens": 400, "temperature": 0,
                   "stream": True}
        async with http.stream("POST", "/v1/completions", json=payload) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # the client goes away after the first chunk
        for _ in range(200):
            if not engine.sessions and svc.free_seqs.qsize() == svc.max_concurrent:
                break
            await asyncio.sleep(0.02)
        return len(engine.sessions), svc.free_seqs.qsize() == svc.max_concurrent

    sessions, all_free = with_stack(tiny_pair, chat_gguf, body,
                                    ServerConfig(emulation=StepEmulation(5)))
    assert sessions == 0 and all_free


@pytest.mark.parametrize("payload,status,param", [
    ({"model": "tiny", "prompt": "x", "temperature": 5}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "n": 100}, 400, "n"),
    ({"model": "tiny", "prompt": 5}, 400, "prompt"),
    ({"model": "tiny", "prompt": "x", "stop": [1]}, 400, "stop"),
    ({"model": "tiny", "prompt": "x", "ignore_eos": "yes"}, 400, "ignore_eos"),
    ({"prompt": "x"}, 400, "model"),
    ({"model": "gpt-9", "prompt": "x"}, 404, "model"),
])
def test_bad_parameters(tiny_pair, chat_gguf, payload, status, param):
    async def body(http, url, svc, engine):
        r = await http.post("/v1/completions", json=payload)
        bad_json = await http.post("/v1/completions", content=b"{not json")
        return r, bad_json

    r, bad_json = with_stack(tiny_pair, chat_gguf, body)
    assert r.status_code == status and r.json()["error"]["param"] == param
    assert "Traceback" not in r.text
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]


def test_ignore_eos_runs_to_max_tokens(tiny_pair, chat_gguf):
    """`ignore_eos` (vLLM's extension) drops the end-of-text stop; without it, EOS stops."""
    async def body(http, url, svc, engine):
        r = await http.post("/v1/completions", json={
            "model": "tiny", "prompt": "import", "max_tokens": 40, "temperature": 1.0,
            "seed": 1, "ignore_eos": True})
        req = {"model": "tiny", "prompt": "x"}
        plain = svc.config(parse_request(req, False, None), 0).stop_ids
        ignoring = svc.config(parse_request({**req, "ignore_eos": True}, False, None), 0).stop_ids
        return r.json(), plain, ignoring, svc.codec.eos_id

    out, plain, ignoring, eos = with_stack(tiny_pair, chat_gguf, body)
    assert out["usage"]["completion_tokens"] == 40
    assert out["choices"][0]["finish_reason"] == "length"
    assert eos is not None and plain == {eos} and ignoring == frozenset()


def test_chat_without_template_is_400(tiny_pair):
    _, _, ggufs = tiny_pair

    async def body(http, url, svc, engine):
        return await http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})

    r = with_stack(tiny_pair, ggufs["q8_0"], body)
    assert r.status_code == 400 and "no chat template" in r.json()["error"]["message"]


@pytest.mark.slow
def test_cloud_down_503_then_recovers(tiny_pair, chat_gguf):
    from acespec.cloud.serving.server import create_server
    from acespec.cloud.verify.engine import Engine

    tok_dir, model, _ = tiny_pair
    vh = Tokenizer.load(tok_dir).vocab_hash()
    port = free_port()
    req = {"model": "tiny", "prompt": "import os\n", "max_tokens": 4, "temperature": 0}

    async def go():
        async with edge_server(f"127.0.0.1:{port}", chat_gguf) as (url, svc), \
                httpx.AsyncClient(base_url=url, timeout=60) as http:
            down = await http.post("/v1/completions", json=req)
            engine = Engine(model, vh, "back")
            server, _ = await create_server(engine, ServerConfig(host="127.0.0.1", port=port))
            up = await http.post("/v1/completions", json=req)
            await server.stop(0)
            metrics = (await http.get("/metrics")).text
            return down, up, metrics

    down, up, metrics = run(go())
    assert down.status_code == 503 and "unreachable" in down.json()["error"]["message"]
    assert up.status_code == 200 and up.json()["usage"]["completion_tokens"] == 4
    assert 'acespec_edge_requests_total{endpoint="completions",status="503"} 1.0' in metrics
    assert "acespec_edge_tokens_total 4.0" in metrics
    passes = up.json()["usage"]["passes"]
    assert f"acespec_edge_passes_total {passes:.1f}" in metrics
    assert "acespec_edge_target_forwards" not in metrics


def test_official_openai_client(tiny_pair, chat_gguf):
    openai = pytest.importorskip("openai")

    async def body(http, url, svc, engine):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
        models = await client.models.list()
        c = await client.completions.create(model="tiny", prompt="import os\n", max_tokens=6,
                                            temperature=0)
        s = await client.completions.create(model="tiny", prompt="import os\n", max_tokens=6,
                                            temperature=0, stream=True)
        streamed = "".join([ch.choices[0].text async for ch in s if ch.choices])
        chat = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        try:
            await client.completions.create(model="nope", prompt="x")
            err = None
        except openai.NotFoundError as e:
            err = e.status_code
        health = (await http.get("/health")).json()
        return models, c, streamed, chat, err, health

    models, c, streamed, chat, err, health = with_stack(tiny_pair, chat_gguf, body)
    assert [m.id for m in models.data] == ["tiny"]
    assert c.choices[0].text == streamed and c.usage.completion_tokens == 6
    assert chat.choices[0].message.role == "assistant"
    assert err == 404 and health["status"] == "ok"
