"""Ollama's /api/chat and /api/generate bodies as the OpenAI path's requests, and the OpenAI
stream's chunks as Ollama's objects (acespec.edge.api.ollama_types): pure, no server."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")

from acespec.edge.api.errors import ApiError  # noqa: E402
from acespec.edge.api.ollama_types import (  # noqa: E402
    OPEN_LENGTH,
    Timing,
    error_body,
    final,
    open_tokens,
    parse_ollama,
    piece_of,
    reply,
    served_name,
    whole,
)
from acespec.shared.config import Penalties  # noqa: E402

ASK = [{"role": "user", "content": "hi"}]


def render(messages, tools=None):
    """A chat template that shows what it was given."""
    return [(json.dumps({"messages": messages, "tools": tools and list(tools.specs)}), False)]


def chat(templated: bool = True, **body):
    return parse_ollama({"model": "m", "messages": ASK, **body}, True, render, templated)


def generate(templated: bool = True, **body):
    return parse_ollama({"model": "m", **body}, False, render, templated)


def rendered(o) -> dict:
    return json.loads(o.req.prompt[0][0])


def test_options_become_the_openai_fields():
    o = chat(stream=False, keep_alive="5m", options={
        "temperature": 0.2, "top_p": 0.5, "top_k": 7, "seed": 11, "num_predict": 9,
        "stop": ["\n\n"], "repeat_penalty": 1.3, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repeat_last_n": -1, "mirostat": 0})
    r = o.req
    assert (r.temperature, r.top_p, r.top_k, r.seed, r.max_tokens) == (0.2, 0.5, 7, 11, 9)
    assert r.stop == ["\n\n"] and r.penalties == Penalties(0.5, -0.5, 1.3)
    assert not o.stream and not o.open_length and o.chat and r.chat
    # run as an OpenAI stream with its usage, waiting out an outage
    assert r.stream and r.include_usage and r.offline == "wait"


def test_ollamas_defaults_and_an_open_length():
    o = chat()
    r = o.req
    assert (r.temperature, r.top_k, r.top_p, r.seed) == (0.8, 40, 0.9, None) and o.stream
    assert o.open_length and r.max_tokens == 1  # until tokenized
    assert open_tokens(r, 100, 2048).max_tokens == 1948
    assert open_tokens(r, 100, 9000).max_tokens == OPEN_LENGTH
    assert open_tokens(r, 3000, 2048).max_tokens == 1
    for n in (-1, -2):
        assert chat(options={"num_predict": n}).open_length
    assert chat(options={"seed": -1}).req.seed is None  # Ollama's "random"
    unset = chat(options={"num_ctx": None, "temperature": None, "mirostat": None}).req
    assert unset.temperature == 0.8  # null: unset, whatever the option


def test_format_is_response_format():
    assert chat(format="json").req.structure.schema is None
    assert chat(format="json").req.structure.param == "response_format"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(format=schema).req.structure.schema == schema
    assert chat(format="").req.structure is None


def test_messages_tool_calls_and_tools():
    tool = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}
    o = chat(tools=[tool], messages=[
        {"role": "system", "content": "be brief", "images": None},
        {"role": "user", "content": "add 1", "images": []},
        {"role": "assistant", "tool_calls": [{"function": {"name": "add",
                                                           "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "1", "tool_name": "add"},
        {"role": "assistant", "content": "it is 1", "thinking": ""}])
    said = rendered(o)
    assert [m["role"] for m in said["messages"]] == ["system", "user", "assistant", "tool",
                                                      "assistant"]
    assert json.loads(said["messages"][2]["content"]) == {"name": "add", "arguments": {"a": 1}}
    assert said["tools"][0]["name"] == "add" and o.req.tools.choice == "auto"
    assert chat(tools=[]).req.tools is None  # the ollama client always sends tools


def test_generate_through_the_template_raw_or_without_one():
    o = generate(prompt="hi", system="be brief")
    assert o.req.chat and not o.chat
    assert rendered(o)["messages"] == [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hi"}]
    raw = generate(prompt="<|user|>hi", raw=True).req
    assert not raw.chat and raw.prompt == "<|user|>hi" and raw.parse_special
    plain = generate(templated=False, prompt="hi").req
    assert not plain.chat and plain.prompt == "hi" and not plain.parse_special


def test_no_prompt_is_the_model_load():
    assert chat(messages=[]).req is None
    assert generate().req is None and generate(prompt="").req is None


@pytest.mark.parametrize("body,named", [
    ({"options": {"temperature": "hot"}}, "'options.temperature' must be a number"),
    ({"options": {"temperature": 9}}, "'options.temperature' must be in"),
    ({"options": {"num_predict": 0}}, "'options.num_predict' must be in"),
    ({"options": {"stop": ["a", 1]}}, "'options.stop' must be"),
    ({"options": {"repeat_penalty": 100}}, "'options.repeat_penalty' must be in"),
    ({"options": {"repeat_last_n": 64}}, "'options.repeat_last_n' is not supported"),
    ({"options": {"num_ctx": 8192}}, "--ctx-per-request"),
    ({"options": {"numa": True}}, "'options.numa' is not an option"),
    ({"options": []}, "'options' must be an object"),
    ({"format": "yaml"}, "'format' must be"),
    ({"format": {"$ref": "#/nowhere"}, "tools": [{"type": "function",
                                                  "function": {"name": "f"}}]}, "'format' and"),
    ({"stream": 1}, "'stream' must be a boolean"),
    ({"keep_alive": [5]}, "'keep_alive' must be"),
    ({"think": True}, "'think' is not supported"),
    ({"logprobs": True}, "'logprobs' is not supported"),
    ({"images": ["AAAA"]}, "'images': this server serves a text model"),
    ({"prompt": "hi"}, "'prompt' is not a field"),
    ({"messages": "hi"}, "'messages' must be a list"),
    ({"messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}]},
     "'messages[0].images'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
     "'messages[0].content' must be a string"),
    ({"messages": [{"role": "user", "content": "hi", "name": "me"}]},
     "'messages[0].name' is not a field"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "'messages[0].role'"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {
        "name": "f", "arguments": "{}"}}]}]},
     "'messages[0].tool_calls[0].function.arguments' must be an object"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [{"function": {
        "name": "f", "arguments": {}}}]}]}, "'messages[0].tool_calls' is not a field"),
])
def test_refusals_name_the_ollama_field(body, named):
    with pytest.raises(ApiError) as e:
        chat(**body)
    assert e.value.status == 400 and named in error_body(e.value)["error"]


def test_generate_refusals():
    for body, named in [({"prompt": "hi", "system": "s", "raw": True}, "'system'"),
                        ({"prompt": "hi", "raw": "yes"}, "'raw' must be a boolean"),
                        ({"prompt": 5}, "'prompt' must be a string"),
                        ({"prompt": "hi", "suffix": "end"}, "'suffix' is not supported"),
                        ({"prompt": "hi", "context": [1, 2]}, "'context' is not supported"),
                        ({"prompt": "hi", "messages": ASK}, "'messages' is not a field")]:
        with pytest.raises(ApiError) as e:
            generate(**body)
        assert named in error_body(e.value)["error"], body
    with pytest.raises(ApiError, match="'system'"):
        generate(templated=False, prompt="hi", system="be brief")
    with pytest.raises(ApiError, match="no chat template; use /api/generate"):
        chat(templated=False)


def test_served_names_take_the_latest_tag():
    assert served_name("acespec", ("acespec",)) and served_name("acespec:latest", ("acespec",))
    assert not served_name("acespec:7b", ("acespec",)) and not served_name("llama3", ("x",))


def test_stream_chunks_become_ollamas_objects():
    o = chat(options={"num_predict": 8})
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 8}}]
    pieces = [piece_of(c) for c in chunks]
    assert [p.text for p in pieces] == ["", "Hel", "lo", ""]
    assert pieces[2].done_reason == "length" and pieces[3].usage["completion_tokens"] == 8
    t = Timing(start=0, generating=10, first=30, end=100)
    objects = [reply(o, "Hel"), reply(o, "lo"), final(o, "length", pieces[3].usage, t)]
    assert objects[0]["message"] == {"role": "assistant", "content": "Hel"}
    assert not objects[0]["done"] and objects[0]["model"] == "m"
    last = objects[-1]
    assert last["done"] and last["message"]["content"] == "" and last["done_reason"] == "length"
    assert (last["total_duration"], last["load_duration"], last["prompt_eval_duration"],
            last["eval_duration"]) == (100, 10, 20, 70)
    assert (last["prompt_eval_count"], last["eval_count"]) == (5, 8)
    one = whole(objects)
    assert one["message"] == {"role": "assistant", "content": "Hello"} and one["done"]


def test_a_tool_call_in_ollamas_shape():
    o = chat()
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": "{\"a\": 1}"}}
    p = piece_of({"choices": [{"index": 0, "delta": {"tool_calls": [call]},
                               "finish_reason": None}]})
    assert p.calls == [{"id": "call_1", "function": {"index": 0, "name": "add",
                                                     "arguments": {"a": 1}}}]
    assert piece_of({"choices": [{"index": 0, "delta": {},
                                  "finish_reason": "tool_calls"}]}).done_reason == "stop"
    t = Timing(0, 0, None, 5)
    one = whole([reply(o, "", p.calls), final(o, "stop", {"prompt_tokens": 1,
                                                          "completion_tokens": 9}, t)])
    assert one["message"]["tool_calls"] == p.calls and one["eval_duration"] == 0


def test_generate_objects_carry_response():
    o = generate(prompt="hi", options={"num_predict": 4})
    objects = [reply(o, "a"), reply(o, "b"), final(o, "stop", None, Timing(0, 0, None, 0))]
    assert objects[0] == {**objects[0], "response": "a", "done": False}
    assert whole(objects)["response"] == "ab" and "message" not in whole(objects)
