"""Ollama's API on `acespec edge serve` started from the shell (with `acespec cloud serve`
serving the tiny target and `--api-key`), through the official `ollama` Python client: chat
and generate, streamed and whole, each greedy answer the OpenAI endpoint's; a `format`
schema, a tool call, the model routes; bad input refused naming the field; the key
required."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
httpx = pytest.importorskip("httpx")
ollama = pytest.importorskip("ollama")
jsonschema = pytest.importorskip("jsonschema")

from cli_harness import edge_serve, verifier  # noqa: E402

pytestmark = pytest.mark.slow
CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
KEY = {"Authorization": "Bearer KEY"}
GREEDY = {"temperature": 0, "num_predict": 12}
ASK = [{"role": "user", "content": "write a loop"}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 9}}}
DIGIT = {"type": "integer", "enum": list(range(10))}  # the client drops minimum, keeps enum
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two digits",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"a": DIGIT, "b": DIGIT}}}}
CALLING = {"temperature": 1, "top_k": 2, "top_p": 1, "num_predict": 80}


@pytest.fixture(scope="module")
def stack(tiny_pair, tmp_path_factory):
    """cloud serve + edge serve --drafter CHAT.gguf --api-key KEY over the tiny target with
    '{' (how a tool call starts) made its second choice, just behind its first: sampled with
    top_k 2 it starts a call about every other seed. Yields (base URL, an ollama client that
    sends the key)."""
    from acespec.models.export_hf import export_hf
    from acespec.models.gguf_export import export_gguf
    from acespec.shared.tokenizer import Tokenizer

    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    (brace,) = tok.encode("{", add_bos=False)
    with torch.no_grad():
        chat = tok.encode("<|user|>hi\n<|assistant|>")  # what CHAT renders
        top = int(model(chat, model.new_cache(), last_only=True)[0].argmax())
        calling = copy.deepcopy(model)
        calling.lm_head.weight[brace] = calling.lm_head.weight[top] * 0.999
    out = tmp_path_factory.mktemp("ollama-target")
    export_hf(calling, tok_dir, out / "hf", tok.bos_id, tok.eos_id)
    gguf = export_gguf(calling, tok_dir, out / "chat.gguf", "q8_0", chat_template=CHAT)
    cloud, addr = verifier("--model", str(out / "hf"))
    with cloud:
        with edge_serve(addr, "--drafter", str(gguf), "--api-key", "KEY") as (url, _):
            yield url, ollama.Client(host=url, headers=KEY, timeout=60)
        cloud.stop(timeout=20)


def openai(url: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{url}/v1/{path}", json={"model": "acespec", "temperature": 0,
                                             "max_tokens": 12, **body},
                   headers=KEY, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_streamed_and_whole_is_the_openai_greedy_answer(stack):
    url, client = stack
    whole = client.chat(model="acespec", messages=ASK, options=GREEDY, keep_alive="5m")
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.model == "acespec"
    assert whole.prompt_eval_count > 0 and 0 < whole.eval_count <= 12
    assert whole.total_duration >= whole.eval_duration > 0
    parts = list(client.chat(model="acespec", messages=ASK, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count and parts[-1].message.content == ""
    reference = openai(url, "chat/completions", {"messages": ASK})
    assert whole.message.content == reference["choices"][0]["message"]["content"]
    assert whole.eval_count == reference["usage"]["completion_tokens"]
    assert whole.prompt_eval_count == reference["usage"]["prompt_tokens"]


def test_generate_streamed_and_whole_templated_and_raw(stack):
    url, client = stack
    whole = client.generate(model="acespec", prompt="write a loop", options=GREEDY)
    assert whole.done and whole.response
    parts = list(client.generate(model="acespec", prompt="write a loop", options=GREEDY,
                                 stream=True))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    # through the chat template: the chat answer to one user message
    assert whole.response == openai(url, "chat/completions", {"messages": ASK})[
        "choices"][0]["message"]["content"]
    raw = client.generate(model="acespec:latest", prompt="def add(a, b):", raw=True,
                          options=GREEDY)
    assert raw.response == openai(url, "completions", {"prompt": "def add(a, b):"})[
        "choices"][0]["text"]


def test_a_format_schema_answer_validates(stack):
    _, client = stack
    r = client.chat(model="acespec", messages=ASK, format=SCHEMA,  # num_predict left open
                    options={"temperature": 0})
    assert r.done_reason == "stop"  # where the grammar ends
    jsonschema.validate(json.loads(r.message.content), SCHEMA)
    r = client.generate(model="acespec", prompt="x = 1", format="json",
                        options={"temperature": 0.7, "seed": 3, "num_predict": 200})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)


def calling_seed(client, ask: list) -> int:
    """A seed whose answer, sampled with top_k 2 and offered ADD, is a call."""
    for seed in range(20):
        r = client.chat(model="acespec", messages=ask, tools=[ADD], options={**CALLING,
                                                                             "seed": seed})
        if r.message.tool_calls:
            return seed
    raise AssertionError("no seed draws a call")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call(stack, stream):
    url, client = stack
    ask = [{"role": "user", "content": "add 2 and 3"}]
    options = {**CALLING, "seed": calling_seed(client, ask)}
    out = client.chat(model="acespec", messages=ask, tools=[ADD], stream=stream,
                      options=options)
    parts = list(out) if stream else [out]
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "add"
    args = calls[0].function.arguments
    assert isinstance(args, dict) and args["a"] in range(10) and args["b"] in range(10)
    assert parts[-1].done and parts[-1].done_reason == "stop"
    # the call and its result go back in the conversation, in Ollama's shape
    follow = client.chat(model="acespec", options=GREEDY, messages=[
        *ask, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "add", "arguments": args}}]},
        {"role": "tool", "content": str(args["a"] + args["b"]), "tool_name": "add"}])
    assert follow.done and follow.eval_count > 0


def test_model_routes(stack):
    url, client = stack
    assert [m.model for m in client.list().models] == ["acespec"]
    shown = client.show("acespec")
    assert shown.template == CHAT and "tools" in shown.capabilities
    running = client.ps().models
    assert [m.model for m in running] == ["acespec"] and running[0].context_length > 0
    r = httpx.get(f"{url}/api/version", headers=KEY)
    assert r.status_code == 200 and r.json()["version"]
    loaded = client.generate(model="acespec")  # no prompt: Ollama's "load the model"
    assert loaded.done and loaded.done_reason == "load"


@pytest.mark.parametrize("path,body,status,named", [
    ("chat", {"options": {"mirostat": 2}}, 400, "'options.mirostat'"),
    ("chat", {"options": {"num_ctx": 4096}}, 400, "'options.num_ctx'"),
    ("chat", {"options": {"temperature": "hot"}}, 400, "'options.temperature'"),
    ("chat", {"options": {"num_predict": 0}}, 400, "'options.num_predict'"),
    ("chat", {"stream": "yes"}, 400, "'stream'"),
    ("chat", {"format": "yaml"}, 400, "'format'"),
    ("chat", {"think": True}, 400, "'think'"),
    ("chat", {"format": "json", "tools": [ADD]}, 400, "'format' and 'tools'"),
    ("chat", {"unknown": 1}, 400, "'unknown'"),
    ("chat", {"messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}]}, 400,
     "'messages[0].images'"),
    ("generate", {"prompt": "hi", "images": ["AAAA"]}, 400, "'images'"),
    ("generate", {"prompt": "hi", "system": "be brief", "raw": True}, 400, "'system'"),
    ("chat", {"model": "llama3"}, 404, "model 'llama3' not found"),
])
def test_bad_input_is_refused_naming_the_field(stack, path, body, status, named):
    url, _ = stack
    full = {"model": "acespec", "stream": False, **({"messages": ASK} if path == "chat" else {}),
            **body}
    r = httpx.post(f"{url}/api/{path}", json=full, headers=KEY, timeout=60)
    assert r.status_code == status, r.text
    assert named in r.json()["error"]


def test_the_client_raises_the_refusal(stack):
    _, client = stack
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3", messages=ASK)
    assert e.value.status_code == 404 and e.value.error == "model 'llama3' not found"
    with pytest.raises(ollama.ResponseError) as e:  # a route this server does not serve
        client.pull("llama3")
    assert e.value.status_code == 404 and "/api/chat" in e.value.error


def test_the_key_is_required(stack):
    url, _ = stack
    for path in ("/api/chat", "/api/generate", "/api/show"):
        r = httpx.post(url + path, json={"model": "acespec"}, timeout=10)
        assert r.status_code == 401 and "API key" in r.json()["error"], (path, r.text)
    assert httpx.get(f"{url}/api/tags", timeout=10).status_code == 401
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url, timeout=10).chat(model="acespec", messages=ASK)
    assert e.value.status_code == 401
