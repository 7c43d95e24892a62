"""Structured output and tools through `acespec edge serve` started from the shell, in acespec
mode and in ar mode, against `acespec cloud serve` serving the tiny (random) target: JSON-schema
answers parse and validate on 20 prompts and equal the constrained target's alone; json_object;
a tool call round-trips through the openai SDK, streamed and not; acceptance with a schema
against free text is printed; requests that cannot be served are refused by name, streamed
or not, before any stream starts: malformed fields, schemas that generate nothing, grammars
over the size limit, and grammars whose compile runs past its bound (while the edge keeps
serving others)."""

from __future__ import annotations

import concurrent.futures
import json
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

import api_stack  # noqa: E402

from conftest import stdlib_texts  # noqa: E402

pytestmark = pytest.mark.slow
servers = api_stack.servers  # the stack's fixture

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"enum": ["red", "green", "blue"]}}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                 "strict": True}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12}}}}}


def prompts(n: int) -> list[str]:
    lines = [ln.strip() for t in stdlib_texts(6) for ln in t.splitlines() if len(ln.strip()) > 8]
    return lines[:n]


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json={"model": "acespec", **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_json_schema_answers_validate_and_are_the_constrained_targets(servers, tiny_pair):
    """20 prompts, greedy: each answer parses, validates against the schema and ends there
    (finish_reason stop: the grammar leaves only the end of text); acespec's equals ar's,
    and the first one equals the constrained target's decoded alone."""
    usage = {"drafted_tokens": 0, "accepted_tokens": 0, "completion_tokens": 0}
    for p in prompts(20):
        body = {"prompt": p, "max_tokens": 96, "temperature": 0, "response_format": FORMAT}
        got = {m: post(servers[m], "/v1/completions", body) for m in servers}
        text = got["acespec"]["choices"][0]["text"]
        assert text == got["ar"]["choices"][0]["text"], p
        jsonschema.validate(json.loads(text), SCHEMA)
        assert got["acespec"]["choices"][0]["finish_reason"] == "stop"
        for k in usage:
            usage[k] += got["acespec"]["usage"][k]
    free = {"drafted_tokens": 0, "accepted_tokens": 0, "completion_tokens": 0}
    for p in prompts(20):
        u = post(servers["acespec"], "/v1/completions",
                 {"prompt": p, "max_tokens": 32, "temperature": 0})["usage"]
        for k in free:
            free[k] += u[k]
    print(json.dumps({"schema": usage, "free_text": free}))
    assert usage["accepted_tokens"] > 0


def test_the_answer_is_the_constrained_target_decoded_alone(servers, tiny_pair):
    from acespec.cloud.verify.verdict import decide
    from acespec.edge.api.structured import response_grammar
    from acespec.shared.config import SamplingParams
    from acespec.shared.grammar import Cursor, tokenizer_from_json
    from acespec.shared.served import ServeParams
    from acespec.shared.tokenizer import Tokenizer

    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    prompt = tok.encode(prompts(1)[0])
    grammar = response_grammar(FORMAT)
    params = ServeParams(SamplingParams(0.8, coupled=True, grammar=grammar,
                                        output_from=len(prompt)))
    cursor = Cursor(tokenizer_from_json(str(tok.path), tok.eos_id), grammar, len(prompt),
                    model.args.vocab_size)
    ids: list[int] = []
    while not ids or ids[-1] != tok.eos_id:
        with torch.no_grad():
            row = model(prompt + ids, model.new_cache(), last_only=True)[0].numpy()
        ids.append(decide(row, params, 5, len(prompt) + len(ids), prompt + ids, cursor))
        assert len(ids) < 96
    body = {"prompt": prompts(1)[0], "max_tokens": 96, "temperature": 0.8, "seed": 5,
            "sampling": "coupled", "response_format": FORMAT}
    for m in servers:
        text = post(servers[m], "/v1/completions", body)["choices"][0]["text"]
        assert text == tok.decode(ids[:-1])
        jsonschema.validate(json.loads(text), SCHEMA)


def test_exact_sampling_answers_in_the_schema(servers):
    """sampling "exact": the edge decides by rejection sampling, from the verifier's masked
    p~ and the drafter's masked q; every answer validates."""
    for seed in range(12):
        c = post(servers["acespec"], "/v1/completions", {
            "prompt": prompts(12)[seed], "max_tokens": 96, "temperature": 1.0, "seed": seed,
            "sampling": "exact", "response_format": FORMAT})["choices"][0]
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c["text"]), SCHEMA)


def test_json_object_through_the_sdk(servers):
    client = openai.OpenAI(base_url=servers["acespec"] + "/v1", api_key="unused", timeout=60,
                           max_retries=0)
    r = client.chat.completions.create(model="acespec", temperature=0, max_tokens=96,
                                       response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": "a person"}])
    if r.choices[0].finish_reason == "stop":  # a random model may not close it in time
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_round_trips_through_the_sdk(servers, stream):
    client = openai.OpenAI(base_url=servers["acespec"] + "/v1", api_key="unused", timeout=60,
                           max_retries=0)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = {"model": "acespec", "temperature": 0, "max_tokens": 64, "tools": [WEATHER],
          "tool_choice": "required"}
    if stream:
        chunks = list(client.chat.completions.create(messages=ask, stream=True, **kw))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [t for d in deltas for t in (d.tool_calls or [])]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        name, arguments, call_id = calls[0].function.name, calls[0].function.arguments, \
            calls[0].id
    else:
        msg = client.chat.completions.create(messages=ask, **kw)
        assert msg.choices[0].finish_reason == "tool_calls"
        assert msg.choices[0].message.content is None
        call = msg.choices[0].message.tool_calls[0]
        name, arguments, call_id = call.function.name, call.function.arguments, call.id
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    follow = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name,
                                                         "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "12 C, cloudy"}]
    reply = client.chat.completions.create(model="acespec", temperature=0, max_tokens=8,
                                           tools=[WEATHER], tool_choice="none",
                                           messages=follow)
    assert reply.choices[0].message.tool_calls is None
    assert reply.usage.prompt_tokens > 0


def test_auto_tool_choice_answers_text_or_a_call(servers):
    r = post(servers["acespec"], "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "temperature": 0,
        "tools": [WEATHER]})["choices"][0]
    if r["finish_reason"] == "tool_calls":
        assert r["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    else:
        assert not r["message"]["content"].startswith("{")


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}},
     "response_format.json_schema.schema"),
])
def test_unservable_structure_is_refused_by_name(servers, body, param):
    r = httpx.post(servers["acespec"] + "/v1/completions", timeout=60, json={
        "model": "acespec", "prompt": "x", "max_tokens": 4, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_masks_agree_between_the_drafters_vocabulary_and_the_targets(tiny_pair):
    """The edge builds llguidance's tokenizer from the GGUF's vocabulary, the verifier from
    tokenizer.json: along a valid answer, they allow the same tokens."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    from acespec.edge.api.structured import response_grammar
    from acespec.edge.drafting.llama import LlamaDrafter
    from acespec.shared.grammar import Cursor, tokenizer_from_json
    from acespec.shared.tokenizer import Tokenizer

    tok_dir, _, ggufs = tiny_pair
    tok = Tokenizer.load(tok_dir)
    grammar = response_grammar(FORMAT)
    cloud = Cursor(tokenizer_from_json(str(tok.path), tok.eos_id), grammar, 0, tok.vocab_size)
    answer = tok.encode('{"name":"ab","age":7,"tags":["red"]}', add_bos=False)
    drafter = LlamaDrafter(ggufs["q8_0"])
    try:  # (llguidance's tokenizer reads the drafter's vocabulary while it lives)
        edge = Cursor(lltokenizer_from_vocab(drafter._vocab), grammar, 0, drafter.vocab_size)
        for i in range(len(answer) + 1):
            assert np.array_equal(edge.mask(answer[:i]), cloud.mask(answer[:i])), i
        assert cloud.mask(answer).sum() == 1  # the answer is whole: only the end of text
    finally:
        drafter.close()


def test_the_drafter_drafts_in_the_grammar_as_the_target_decides(tiny_pair):
    """The f32 drafter (the target's weights in llama.cpp) with the schema's grammar drafts
    the constrained target's greedy answer."""
    from acespec.cloud.verify.verdict import decide
    from acespec.edge.api.structured import response_grammar
    from acespec.edge.drafting.llama import LlamaDrafter
    from acespec.shared.config import SamplingParams
    from acespec.shared.grammar import Cursor, tokenizer_from_json
    from acespec.shared.served import ServeParams
    from acespec.shared.tokenizer import Tokenizer

    tok_dir, model, ggufs = tiny_pair
    tok = Tokenizer.load(tok_dir)
    prompt = tok.encode(prompts(1)[0])
    grammar = response_grammar(FORMAT)
    params = ServeParams(SamplingParams(grammar=grammar, output_from=len(prompt)))
    cursor = Cursor(tokenizer_from_json(str(tok.path), tok.eos_id), grammar, len(prompt),
                    model.args.vocab_size)
    ids: list[int] = []
    for _ in range(12):
        with torch.no_grad():
            row = model(prompt + ids, model.new_cache(), last_only=True)[0].numpy()
        ids.append(decide(row, params, 0, len(prompt) + len(ids), prompt + ids, cursor))
    drafter = LlamaDrafter(ggufs["f32"])
    try:
        draft = drafter.draft(prompt, 12, params.sampling, np.random.default_rng(0))
        free = drafter.draft(prompt, 12, SamplingParams(), np.random.default_rng(0), seq=1)
    finally:
        drafter.close()
    assert list(draft.tokens) == ids
    assert list(free.tokens) != ids


def ask(url: str, path: str, body: dict, stream: bool = False) -> httpx.Response:
    base = {"messages": [{"role": "user", "content": "q"}]} if "chat" in path else \
        {"prompt": "x"}
    return httpx.post(url + path, timeout=60, json={
        "model": "acespec", "max_tokens": 4, "stream": stream, **base, **body})


def schema_format(schema: dict, **spec) -> dict:
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "s", "schema": schema, **spec}}}


def properties(n: int, prefix: str = "p") -> dict:
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "string"}
                                             for i in range(n)}}


CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize("path,body,param,code", [
    # a string where tool_choice's function object belongs
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": "get_weather"}}, "tool_choice.function", None),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {
        "type": "tool", "function": {"name": "get_weather"}}}, "tool_choice.type", None),
    # schemas no JSON value satisfies: nothing to generate
    ("/v1/completions", schema_format({"$ref": "#"}), "response_format.json_schema.schema",
     "invalid_schema"),
    ("/v1/completions", schema_format(CYCLE), "response_format.json_schema.schema",
     "invalid_schema"),
    # too complex for the grammar engine to follow (its mask would leave the answer free)
    ("/v1/completions", schema_format(properties(600)), "response_format.json_schema.schema",
     "invalid_schema"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"$ref": "#"}}}], "tool_choice": "required"},
     "tools[0].function.parameters", "invalid_schema"),
    # json_schema's own fields, typed as OpenAI types them
    ("/v1/completions", schema_format({"type": "object"}, strict="yes"),
     "response_format.json_schema.strict", None),
    ("/v1/completions", schema_format({"type": "object"}, name=3),
     "response_format.json_schema.name", None),
    ("/v1/completions", schema_format({"type": "object"}, name="a b"),
     "response_format.json_schema.name", None),
    ("/v1/completions", schema_format({"type": "object"}, stirct=True),
     "response_format.json_schema.stirct", "unknown_parameter"),
    # too many tools (OpenAI's limit)
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": f"f{i}"}}
                                        for i in range(3000)]}, "tools", None),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_structure_is_a_400_naming_the_field_streamed_or_not(servers, path, body, param,
                                                                 code, stream):
    r = ask(servers["acespec"], path, body, stream)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert code is None or err["code"] == code, err


@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_over_the_verifiers_limit_names_response_format(servers, stream):
    """A 60,000-value enum: its grammar could never reach the verifier (MAX_GRAMMAR_CHARS);
    the 400 names response_format, the limit and the size, not the prompt."""
    from acespec.proto.codec import MAX_GRAMMAR_CHARS

    enum = {"type": "object", "properties": {"a": {"enum": [f"v{i}" for i in range(60000)]}}}
    t0 = time.monotonic()
    r = ask(servers["acespec"], "/v1/completions", schema_format(enum), stream)
    assert time.monotonic() - t0 < 1.0  # refused by its size, before compiling
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "response_format", r.text
    assert err["code"] == "grammar_too_large"
    assert str(MAX_GRAMMAR_CHARS) in err["message"]
    assert str(len(json.dumps(enum, separators=(",", ":")))) in err["message"]


def test_a_large_schema_compiles_off_the_loop_within_a_time_bound(servers):
    """Two clients send 6,000-property schemas (173 KB each: under the size limit, but their
    grammars take seconds to build): each is refused with a 400 naming response_format and
    the bound, the edge's event loop keeps answering /health and an honest client meanwhile,
    and the same schema again is refused at once."""
    url = servers["acespec"]
    big = [schema_format(properties(6000, prefix)) for prefix in ("a", "b")]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        floods = [pool.submit(ask, url, "/v1/completions", b) for b in big]
        honest = pool.submit(ask, url, "/v1/completions", {"max_tokens": 16})
        gaps = []
        while not all(f.done() for f in floods):
            t0 = time.monotonic()
            assert httpx.get(url + "/health", timeout=10).status_code == 200
            gaps.append(time.monotonic() - t0)
            time.sleep(0.05)
        assert honest.result().status_code == 200, honest.result().text
        for f in floods:
            err = f.result().json()["error"]
            assert f.result().status_code == 400 and err["param"] == "response_format", err
            assert err["code"] == "grammar_too_costly" and " s " in err["message"], err
    print(json.dumps({"health_checks": len(gaps), "slowest_health_s": round(max(gaps), 3)}))
    assert len(gaps) > 5 and max(gaps) < 1.0  # a build on the loop: seconds (its bound)
    t0 = time.monotonic()
    again = ask(url, "/v1/completions", big[0])
    assert again.status_code == 400 and time.monotonic() - t0 < 1.0
    assert again.json()["error"]["code"] == "grammar_too_costly"


def test_a_schema_under_the_bounds_is_served_after_a_refused_one(servers):
    """A 200-property schema compiles within the bound and is served, streamed too."""
    body = {**schema_format(properties(200)), "max_tokens": 8, "temperature": 0}
    r = ask(servers["acespec"], "/v1/completions", body)
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("{"), r.text
    with httpx.stream("POST", servers["acespec"] + "/v1/completions", timeout=60, json={
            "model": "acespec", "prompt": "x", "stream": True, **body}) as s:
        assert s.status_code == 200
        assert s.read().decode().rstrip().endswith("data: [DONE]")
