"""What real OpenAI clients send, parsed and served in process: content as text parts, the
default values SDKs send for features this server lacks, served model names and aliases,
/v1/models/{id}, stream_options, user and metadata. The engine is a stand-in (the real one,
with real clients over a socket: tests/e2e/test_openai_clients.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from acespec.cli import build_parser  # noqa: E402
from acespec.edge.api.app import EdgeMetrics, create_app  # noqa: E402
from acespec.edge.api.openai_types import ApiError, parse_request  # noqa: E402
from acespec.edge.api.params import OFF  # noqa: E402
from acespec.edge.api.service import EdgeService  # noqa: E402
from acespec.edge.commands import served_model_names  # noqa: E402
from acespec.edge.session import EngineConfig, Stats  # noqa: E402
from acespec.edge.text import TextCodec  # noqa: E402

CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
EOS = 256


def render(messages: list[dict], tools=None) -> list[tuple[str, bool]]:
    return [(json.dumps(messages), False)]


def chat(*messages, **extra) -> dict:
    return {"model": "m", "messages": list(messages), **extra}


def parsed(body: dict, chat_endpoint: bool = True):
    """The request as the server serves it: parsed, then its structure compiled."""
    req = parse_request(body, chat_endpoint, render)
    if req.structure is not None:
        req = dataclasses.replace(req, grammar=req.structure.compile()[0])
    return req


def refused(body: dict, chat_endpoint: bool = True) -> ApiError:
    with pytest.raises(ApiError) as e:
        parsed(body, chat_endpoint)
    assert e.value.status == 400
    return e.value


def rendered(body: dict) -> list[dict]:
    return json.loads(parse_request(body, True, render).prompt[0][0])


# -- content parts ---------------------------------------------------------------------

def test_text_parts_are_joined_in_order_with_a_newline():
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"},
             {"type": "text", "text": ""}, {"type": "text", "text": "third"}]
    assert rendered(chat({"role": "user", "content": parts})) == [
        {"role": "user", "content": "first\nsecond\n\nthird"}]
    assert rendered(chat({"role": "user", "content": [{"type": "text", "text": "x"}]})) == [
        {"role": "user", "content": "x"}]


def test_developer_is_system_and_every_text_role_takes_parts():
    text = [{"type": "text", "text": "t"}]
    got = rendered(chat({"role": "developer", "content": text},
                        {"role": "system", "content": text}, {"role": "user", "content": text},
                        {"role": "assistant", "content": text}))
    assert [m["role"] for m in got] == ["system", "system", "user", "assistant"]


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    {"type": "file", "file": {"file_id": "f"}},
    {"type": "refusal", "refusal": "no"},
    {"type": "video_url", "video_url": {"url": "x"}},
])
def test_other_parts_are_400_naming_type_and_index(part):
    e = refused(chat({"role": "system", "content": "s"},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, part]}))
    assert e.param == "messages[1].content[1]" and repr(part["type"]) in e.message
    assert e.code == "unsupported_content_part"


@pytest.mark.parametrize("message,param", [
    ({"role": "user", "content": []}, "messages[0].content"),
    ({"role": "user", "content": [{"text": "a"}]}, "messages[0].content[0]"),
    ({"role": "user", "content": ["a"]}, "messages[0].content[0]"),
    ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0].text"),
    ({"role": "user", "content": [{"type": "text", "text": 1}]}, "messages[0].content[0].text"),
    ({"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]},
     "messages[0].content[0].cache_control"),
    ({"role": "user", "content": {"type": "text", "text": "a"}}, "messages[0].content"),
    ({"role": "user"}, "messages[0].content"),
    ({"role": "assistant", "content": None}, "messages[0].content"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
     "messages[0].tool_calls[0]"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                              "function": {"name": "f",
                                                                           "arguments": "{"}}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"role": "tool", "content": "4"}, "messages[0].tool_call_id"),
    ({"role": "user", "content": "4", "tool_call_id": "c"}, "messages[0].tool_call_id"),
    ({"role": "function", "content": "4", "name": "f"}, "messages[0].role"),
    ({"role": "user", "content": "a", "name": "bob"}, "messages[0].name"),
    ({"role": "user", "content": "a", "weight": 1}, "messages[0].weight"),
    ({"role": "narrator", "content": "a"}, "messages[0].role"),
])
def test_bad_messages_are_400_naming_the_field(message, param):
    assert refused(chat(message)).param == param


def test_tool_calls_and_results_reach_the_template_as_text():
    got = rendered(chat({"role": "user", "content": "weather?"},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "call_1", "type": "function", "function": {
                                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}))
    assert got[1:] == [{"role": "assistant",
                        "content": '{"name":"get_weather","arguments":{"city":"Paris"}}'},
                       {"role": "tool", "content": "12 C"}]


def test_off_message_fields_are_accepted():
    got = rendered(chat({"role": "user", "content": "q", "name": None},
                        {"role": "assistant", "content": "a", "tool_calls": [],
                         "function_call": None, "refusal": None, "audio": None}))
    assert got == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


# -- every field: honoured, accepted when off, or refused by name ----------------------

SDK_DEFAULTS = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False,
                "top_logprobs": 0, "logit_bias": {}, "parallel_tool_calls": True,
                "store": False, "service_tier": "auto", "tools": [], "tool_choice": "none",
                "response_format": {"type": "text"}, "modalities": ["text"], "audio": None,
                "prediction": None, "reasoning_effort": None, "web_search_options": None,
                "functions": None, "function_call": None, "stop": None, "seed": None,
                "repetition_penalty": 1.0, "min_p": 0.0, "top_k": 0}


def test_default_valued_fields_sdks_send_are_accepted():
    req = parse_request(chat({"role": "user", "content": "q"}, **SDK_DEFAULTS), True, render)
    assert req.n == 1 and req.stop == [] and req.top_k == 0


@pytest.mark.parametrize("name", sorted(OFF))
def test_off_only_fields_accept_null_and_off_and_refuse_the_rest(name):
    for off in OFF[name]:
        parse_request(chat({"role": "user", "content": "q"}, **{name: off}), True, render)
    parse_request(chat({"role": "user", "content": "q"}, **{name: None}), True, render)
    e = refused(chat({"role": "user", "content": "q"}, **{name: {"on": True}}))
    assert e.param == name and e.code == "unsupported_parameter" and "not supported" in e.message


@pytest.mark.parametrize("name,value", [("presence_penalty", 2.5), ("frequency_penalty", "1"),
                                        ("repetition_penalty", 0), ("logit_bias", {"5": 10}), ("n", 9), ("best_of", 2),
                                        ("response_format", {"type": "yaml"}),
                                        ("tool_choice", "auto"), ("store", True),
                                        ("service_tier", "flex"), ("modalities", ["audio"]),
                                        ("reasoning_effort", "low"), ("echo", True),
                                        ("logprobs", 1)])
def test_features_not_served_are_400_naming_them(name, value):
    assert refused(chat({"role": "user", "content": "q"}, **{name: value})).param == name


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.parametrize("fields,param", [
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f",
                                                  "parameters": {"type": "objekt"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                 "schema": {"$ref": "#/no"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": "json"}, "response_format"),
])
def test_bad_structure_requests_name_the_field(fields, param):
    e = refused(chat({"role": "user", "content": "q"}, **fields))
    assert e.param == param and e.status == 400, e.message


def test_structure_requests_compile_to_grammars():
    def ask(**fields):
        return parsed(chat({"role": "user", "content": "q"}, **fields))
    assert ask().grammar is None and ask().tools is None
    assert ask(response_format={"type": "text"}).grammar is None
    assert "json_schema" in ask(response_format={"type": "json_object"}).grammar
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert '"n"' in ask(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": schema, "strict": True}}).grammar
    assert ask(tools=[WEATHER], tool_choice="none").tools is None
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        req = ask(tools=[WEATHER], tool_choice=choice)
        assert req.tools.specs[0]["name"] == "get_weather" and "get_weather" in req.grammar
    assert ask(tools=[WEATHER]).tools.choice == "auto"  # OpenAI's default


def test_logprobs_fields_in_each_endpoints_shape():
    def ask(chat_endpoint: bool, **fields):
        body = chat({"role": "user", "content": "q"}, **fields) if chat_endpoint else \
            {"model": "m", "prompt": "x", **fields}
        return parse_request(body, chat_endpoint, render).logprobs
    assert ask(True) is None and ask(True, logprobs=False, top_logprobs=0) is None
    assert ask(True, logprobs=True) == 0 and ask(True, logprobs=True, top_logprobs=20) == 20
    assert ask(False) is None and ask(False, logprobs=0) == 0 and ask(False, logprobs=5) == 5
    for chat_endpoint, fields, param in [
            (True, {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
            (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
            (False, {"logprobs": True}, "logprobs"), (False, {"logprobs": -1}, "logprobs"),
            (False, {"top_logprobs": 2}, "top_logprobs")]:  # not a completions field
        with pytest.raises(ApiError) as e:
            ask(chat_endpoint, **fields)
        assert e.value.param == param and e.value.status == 400


@pytest.mark.parametrize("body,chat_endpoint,param", [
    (chat({"role": "user", "content": "q"}, frobnicate=1), True, "frobnicate"),
    (chat({"role": "user", "content": "q"}, prompt="x"), True, "prompt"),
    (chat({"role": "user", "content": "q"}, parse_special=True), True, "parse_special"),
    ({"model": "m", "prompt": "x", "messages": []}, False, "messages"),
    ({"model": "m", "prompt": "x", "best_of_n": 2}, False, "best_of_n"),
])
def test_unknown_fields_are_400_naming_them(body, chat_endpoint, param):
    e = refused(body, chat_endpoint)
    assert e.param == param and e.code == "unknown_parameter" and param in e.message


def test_what_guidellm_sends_is_served():
    """guidellm 0.8's chat and text bodies: parts, max_completion_tokens, stop null,
    ignore_eos and both stream options."""
    streamed = {"stream": True, "stream_options": {"include_usage": True,
                                                   "continuous_usage_stats": True}}
    req = parse_request({"model": "m", **streamed, "max_completion_tokens": 32, "stop": None,
                         "ignore_eos": True, "messages": [
                             {"role": "system", "content": "prefix"},
                             {"role": "user", "content": [{"type": "text", "text": "q"}]}]},
                        True, render)
    assert (req.max_tokens, req.ignore_eos, req.include_usage, req.continuous_usage) == \
        (32, True, True, True)
    req = parse_request({"model": "m", **streamed, "max_tokens": 8, "stop": None,
                         "ignore_eos": True, "prompt": "text"}, False, render)
    assert (req.max_tokens, req.ignore_eos, req.continuous_usage, req.prompt) == \
        (8, True, True, "text")


def test_max_tokens_and_max_completion_tokens():
    q = {"role": "user", "content": "q"}
    assert parse_request(chat(q, max_tokens=7, max_completion_tokens=None), True, render
                         ).max_tokens == 7
    assert parse_request(chat(q, max_tokens=7, max_completion_tokens=7), True, render
                         ).max_tokens == 7
    assert parse_request(chat(q, max_completion_tokens=5), True, render).max_tokens == 5
    assert refused(chat(q, max_tokens=7, max_completion_tokens=8)).param == "max_tokens"
    assert refused(chat(q, max_completion_tokens=0)).param == "max_completion_tokens"


@pytest.mark.parametrize("options,stream,param", [
    ({"include_usage": True}, False, "stream_options"),
    ({"include_usage": True}, None, "stream_options"),
    ({"include_usage": "yes"}, True, "stream_options.include_usage"),
    ({"continuous_usage_stats": 1}, True, "stream_options.continuous_usage_stats"),
    ({"include_obfuscation": True}, True, "stream_options.include_obfuscation"),
    ({"chunk_size": 4}, True, "stream_options.chunk_size"),
    ([], True, "stream_options"),
])
def test_bad_stream_options_are_400(options, stream, param):
    body = chat({"role": "user", "content": "q"}, stream_options=options)
    if stream is not None:
        body["stream"] = stream
    assert refused(body).param == param


def test_stream_options_each_on_its_own():
    q = {"role": "user", "content": "q"}

    def opts(**o):
        r = parse_request(chat(q, stream=True, stream_options=o), True, render)
        return r.include_usage, r.continuous_usage
    assert opts() == (False, False)
    assert opts(include_usage=True) == (True, False)
    assert opts(continuous_usage_stats=True) == (False, True)
    assert opts(include_usage=True, continuous_usage_stats=True,
                include_obfuscation=False) == (True, True)
    assert parse_request(chat(q, stream=False, stream_options=None), True, render)


@pytest.mark.parametrize("extra,param", [
    ({"user": 5}, "user"), ({"safety_identifier": ["x"]}, "safety_identifier"),
    ({"metadata": "tag"}, "metadata"), ({"metadata": {"k": 1}}, "metadata.k"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "metadata." + "k" * 40),
    ({"metadata": {"k": "v" * 513}}, "metadata.k"),
])
def test_bad_user_and_metadata_are_400(extra, param):
    assert refused(chat({"role": "user", "content": "q"}, **extra)).param == param


# -- served names ----------------------------------------------------------------------

def names(*flags: str) -> tuple[str, ...]:
    return served_model_names(build_parser().parse_args(["edge", "serve", *flags]))


def test_served_model_names():
    assert names() == ("acespec",)
    assert names("--pair", "smollm2") == ("SmolLM2-135M-Instruct", "acespec")
    assert names("--pair", "demo") == ("acespec-demo", "acespec")
    assert names("--pair", "smollm2", "--served-model-name", "a", "b", "a") == ("a", "b")
    assert names("--served-model-name", "tiny") == ("tiny",)
    with pytest.raises(ValueError, match="--served-model-name"):
        names("--served-model-name", " x")


# -- the app, with a stand-in engine ---------------------------------------------------

class ScriptedEngine:
    """Commits `script` one token per round, applying the config's stop ids and max_tokens
    as edge.session.runner does; records each prompt and config it was given."""

    def __init__(self, script: list[int]):
        self.script, self.prompts, self.configs = script, [], []

    async def generate(self, prompt, cfg: EngineConfig, on_tokens=None, seq=0, branch_seq=None,
                       on_event=None):
        self.prompts.append(list(prompt))
        self.configs.append(cfg)
        out, stats = [], Stats()
        for t in self.script:
            if t in cfg.stop_ids or len(out) >= cfg.max_tokens:
                break
            out.append(t)
            stats.tokens, stats.rounds, stats.passes = len(out), len(out), len(out)
            if on_tokens is not None and on_tokens([t], stats):
                break
            await asyncio.sleep(0)
        return out, stats


@pytest.fixture
def app():
    codec = TextCodec(lambda t: list(t.encode()), lambda i: bytes([i]) if i < 256 else b"",
                      None, EOS, "bytes")
    svc = EdgeService(codec=codec, drafter=None, connect=lambda: None, model_name="tiny-llama",
                      aliases=("my-model", "a/b"), base=EngineConfig(), chat_template=CHAT,
                      metrics=EdgeMetrics())
    svc.engine = ScriptedEngine(list(b"hello world") + [EOS] + list(b" more"))
    with TestClient(create_app(svc)) as client:
        yield client, svc


def test_models_list_and_retrieve(app):
    client, svc = app
    listed = client.get("/v1/models").json()
    assert [m["id"] for m in listed["data"]] == ["tiny-llama", "my-model", "a/b"]
    for name in ("tiny-llama", "my-model", "a/b"):
        r = client.get(f"/v1/models/{name}")
        assert r.status_code == 200 and r.json() == {
            "id": name, "object": "model", "created": svc.created, "owned_by": "acespec"}
    r = client.get("/v1/models/gpt-4o")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "'tiny-llama', 'my-model', 'a/b'" in r.json()["error"]["message"]


def test_any_served_name_is_accepted_and_the_first_reported(app):
    client, _ = app
    for name in ("tiny-llama", "my-model", "a/b"):
        r = client.post("/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == "tiny-llama"
    r = client.post("/v1/completions", json={"model": "acespec", "prompt": "x"})
    error = r.json()["error"]
    assert r.status_code == 404 and "'acespec' does not exist" in error.pop("message")
    assert error == {"type": "invalid_request_error", "param": "model",
                     "code": "model_not_found"}


def test_parts_reach_the_engine_as_the_joined_text(app):
    client, svc = app
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    for content in (parts, "a\nb"):
        r = client.post("/v1/chat/completions", json={
            "model": "tiny-llama", "messages": [{"role": "user", "content": content}]})
        assert r.status_code == 200, r.text
    assert svc.engine.prompts[0] == svc.engine.prompts[1] == list(b"<|user|>a\nb\n<|assistant|>")


def test_ignore_eos_reaches_the_stop_logic(app):
    client, svc = app
    body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 17}
    stopped = client.post("/v1/completions", json=body).json()
    ignored = client.post("/v1/completions", json={**body, "ignore_eos": True}).json()
    assert svc.engine.configs[0].stop_ids == {EOS} and svc.engine.configs[1].stop_ids == set()
    assert stopped["choices"][0] == {
        "index": 0, "text": "hello world", "logprobs": None, "finish_reason": "stop"}
    assert ignored["usage"]["completion_tokens"] == 17
    assert ignored["choices"][0]["finish_reason"] == "length"
    assert ignored["choices"][0]["text"] == "hello world more"  # EOS has no text


def events(client, body: dict) -> list[dict]:
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_continuous_usage_stats_put_usage_on_every_chunk(app):
    client, _ = app
    body = {"model": "my-model", "messages": [{"role": "user", "content": "q"}], "stream": True,
            "max_tokens": 5}
    both = events(client, {**body, "stream_options": {"include_usage": True,
                                                      "continuous_usage_stats": True}})
    assert all("usage" in e for e in both) and both[-1]["choices"] == []
    counts = [e["usage"]["completion_tokens"] for e in both]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 5
    assert {e["usage"]["prompt_tokens"] for e in both} == {len(b"<|user|>q\n<|assistant|>")}
    assert all(e["model"] == "tiny-llama" for e in both)
    each = events(client, {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" in e and e["choices"] for e in each)  # no usage-only last chunk
    last = events(client, {**body, "stream_options": {"include_usage": True}})
    assert ["usage" in e for e in last] == [False] * (len(last) - 1) + [True]
    assert last[-1]["usage"]["completion_tokens"] == 5
    plain = events(client, body)
    assert not any("usage" in e for e in plain)


def test_a_stream_cut_by_max_tokens_sends_the_text_held_for_a_stop_string(app):
    client, _ = app
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "q"}],
            "max_tokens": 9, "stop": ["wxyz"]}  # "hello wor": "wor" could start "wxyz"
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    streamed = events(client, {**body, "stream": True})
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in streamed)
    assert whole["message"]["content"] == text == "hello wor"
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"


def test_user_and_metadata_are_logged_once_per_request(app, caplog):
    client, _ = app
    caplog.set_level(logging.INFO, logger="acespec.edge.api.service")
    r = client.post("/v1/chat/completions", json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2,
        "user": "alice\nforged line\u2028", "metadata": {"team": "edge", "run": "7"},
        "safety_identifier": "hash-1"})
    assert r.status_code == 200, r.text
    lines = [rec.getMessage() for rec in caplog.records if "request model=" in rec.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert 'user="alice\\nforged line\\u2028"' in lines[0]
    assert 'safety_identifier="hash-1"' in lines[0]
    assert 'metadata={"team":"edge","run":"7"}' in lines[0]


def test_refusals_over_http_name_the_field(app):
    client, _ = app
    r = client.post("/v1/chat/completions", json={"model": "tiny-llama", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                     {"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1]"
    assert "'image_url'" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"model": "tiny-llama", "prompt": "x",
                                             "frobnicate": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
