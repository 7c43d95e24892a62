"""Structured output and tools: OpenAI's `response_format`, `tools` and `tool_choice` as one
grammar (acespec.shared.grammar), and the tool calls read back from the answer.

A tool call is the JSON object {"name": <a tool's name>, "arguments": <its parameters>},
whose shape the grammar enforces: with `tool_choice` "required" or a named function the
answer is one such object; with "auto" it is either one (it starts with "{") or free text.
The answer's tool call becomes the message's `tool_calls` (`finish_reason` "tool_calls").
Earlier calls and their results travel back in the conversation as OpenAI spells them
(an assistant message's `tool_calls`, `tool` messages), which the chat template sees as
text in that same JSON form.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from acespec.edge.api import json_text
from acespec.edge.api.errors import ApiError
from acespec.proto.codec import MAX_GRAMMAR_CHARS
from acespec.shared.grammar import GrammarError, check_generates, json_grammar, new_matcher

COMPACT = {"whitespace_flexible": False}  # JSON without spare whitespace: fewer tokens
MAX_SCHEMA_CHARS = MAX_GRAMMAR_CHARS  # a schema's JSON text: its grammar carries it whole,
# and the verifier takes grammars up to MAX_GRAMMAR_CHARS characters
MAX_TOOLS = 128  # OpenAI's limit
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
JSON_SCHEMA_KEYS = ("name", "description", "schema", "strict")


@dataclass(frozen=True)
class Tools:
    """The tools a request offers and how the answer may use them."""

    specs: tuple[dict, ...]  # OpenAI function objects: {name, description?, parameters?}
    choice: str  # "auto" | "required" | "named"
    checked: tuple[dict, ...] = ()  # every tool the request offered (each must compile)


@dataclass(frozen=True)
class Structure:
    """What a request's answer must follow, checked in shape and size but not compiled:
    compiling takes up to seconds, so it runs off the event loop (edge.api.grammar_work)."""

    param: str  # the field that asks for it: "response_format" or "tools"
    text: str  # the JSON it compiles from (what `size` measures; the compile cache's key)
    schema: dict | None = None  # response_format's schema (None: any JSON object)
    tools: Tools | None = None

    @property
    def size(self) -> int:
        return len(self.text)

    def compile(self, tokenizer=None) -> tuple[str, object]:
        """(llguidance's grammar, its matcher at the start of text over `tokenizer`'s
        vocabulary (None: the 256 bytes), which a drafter can copy); ApiError 400 naming the
        field when a schema cannot be compiled, generates nothing, or makes a grammar longer
        than the verifier takes."""
        if self.tools is None:
            at = "response_format" if self.schema is None else \
                "response_format.json_schema.schema"
            grammar = _grammar_text(self.schema, at)
        else:
            for i, spec in enumerate(self.tools.checked):
                at = f"tools[{i}].function.parameters"
                _matcher(_grammar_text(spec["parameters"], at), at)
            grammar, at = _tools_grammar(self.tools.specs, self.tools.choice), "tools"
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise ApiError(400, f"'{self.param}' makes a grammar of {len(grammar)} characters; "
                           f"the verifier takes at most {MAX_GRAMMAR_CHARS}", self.param,
                           code="grammar_too_large")
        return grammar, _matcher(grammar, at, tokenizer)


def _measured(param: str, value) -> str:
    """The JSON text of what `param` asks the answer to follow; ApiError 400 naming the limit
    and the size when it is longer than a grammar may be (checked before compiling)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_SCHEMA_CHARS:
        raise ApiError(400, f"'{param}' is {len(text)} characters of JSON schema; this server "
                       f"compiles at most {MAX_SCHEMA_CHARS} per request", param,
                       code="grammar_too_large")
    return text


def response_structure(value) -> Structure | None:
    """What `response_format` asks for (None: free text); ApiError 400 naming the field."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ApiError(400, "'response_format' must be an object with a 'type'", "response_format")
    kind = value["type"]
    extra = next((k for k in value if k not in ("type", "json_schema")), None)
    if extra is not None:
        raise ApiError(400, f"'response_format.{extra:.40}' is not a field of response_format",
                       f"response_format.{extra:.40}", code="unknown_parameter")
    if kind in ("text", "json_object") and value.get("json_schema") is not None:
        raise ApiError(400, f"'response_format.json_schema' goes with type json_schema, not "
                       f"{kind}", "response_format.json_schema")
    if kind == "text":
        return None
    if kind == "json_object":
        return Structure("response_format", "null")
    if kind != "json_schema":
        raise ApiError(400, f"'response_format.type' must be text, json_object or json_schema, "
                       f"got {kind!r:.40}", "response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ApiError(400, "'response_format.json_schema' must be an object with a 'schema' "
                       "object", "response_format.json_schema")
    _check_json_schema_fields(spec)
    schema = spec.get("schema", {})
    return Structure("response_format", _measured("response_format", schema), schema)


def _check_json_schema_fields(spec: dict) -> None:
    """json_schema's name, description and strict as OpenAI types them (nothing else)."""
    at = "response_format.json_schema"
    for key in spec:
        if key not in JSON_SCHEMA_KEYS:
            raise ApiError(400, f"'{at}.{key:.40}' is not a field of json_schema (it has "
                           f"{', '.join(JSON_SCHEMA_KEYS)})", f"{at}.{key:.40}",
                           code="unknown_parameter")
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and SCHEMA_NAME.fullmatch(name)):
        raise ApiError(400, f"'{at}.name' must be a string of 1 to 64 letters, digits, _ or -, "
                       f"got {name!r:.40}", f"{at}.name")
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise ApiError(400, f"'{at}.description' must be a string", f"{at}.description")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ApiError(400, f"'{at}.strict' must be a boolean (true or false), got "
                       f"{spec['strict']!r:.40}", f"{at}.strict")


def response_grammar(value) -> str | None:
    """The grammar of `response_format`, compiled here and now (None: free text)."""
    structure = response_structure(value)
    return None if structure is None else structure.compile()[0]


def parse_tools(tools, choice) -> Tools | None:
    """The request's tools under its tool_choice (None: no tool may be called); ApiError 400
    naming the field."""
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise ApiError(400, "'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function tools", "tools")
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"'tools' lists {len(tools)} tools; at most {MAX_TOOLS}", "tools")
    specs = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ApiError(400, "'tools' name a function twice", "tools")
    choice = "auto" if choice is None else choice
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = _named_choice(choice)
        if name not in names:
            raise ApiError(400, f"'tool_choice' must name one of the tools ({', '.join(names)})",
                           "tool_choice.function.name")
        return Tools(tuple(s for s in specs if s["name"] == name), "named", specs)
    if choice not in ("auto", "required"):
        raise ApiError(400, "'tool_choice' must be none, auto, required or "
                       "{type: function, function: {name}}", "tool_choice")
    return Tools(specs, choice, specs)


def _named_choice(choice: dict) -> str:
    """The function a tool_choice object names: {type: function, function: {name}}."""
    if choice.get("type") != "function":
        raise ApiError(400, "'tool_choice.type' must be \"function\"", "tool_choice.type")
    function = choice.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, "'tool_choice.function' must be an object {name: <a tool's name>}, "
                       f"got {function!r:.40}", "tool_choice.function")
    return function["name"]


def tools_structure(tools: Tools) -> Structure:
    """What the tools ask the answer to follow; ApiError 400 when over the size limit."""
    return Structure("tools", _measured("tools", [[[s["name"], s["parameters"]]
                                                   for s in tools.checked],
                                                  [s["name"] for s in tools.specs],
                                                  tools.choice]), tools=tools)


def _tool(t, at: str) -> dict:
    if not isinstance(t, dict) or t.get("type") != "function" or \
            not isinstance(t.get("function"), dict):
        raise ApiError(400, f"'{at}' must be {{type: function, function: {{name, ...}}}}", at)
    f = t["function"]
    if not isinstance(f.get("name"), str) or not f["name"]:
        raise ApiError(400, f"'{at}.function.name' is required", f"{at}.function.name")
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise ApiError(400, f"'{at}.function.description' must be a string",
                       f"{at}.function.description")
    if f.get("strict") is not None and not isinstance(f["strict"], bool):
        raise ApiError(400, f"'{at}.function.strict' must be a boolean (true or false)",
                       f"{at}.function.strict")
    params = f.get("parameters", {"type": "object"})
    if not isinstance(params, dict):
        raise ApiError(400, f"'{at}.function.parameters' must be a JSON schema object",
                       f"{at}.function.parameters")
    return {"name": f["name"], "description": f.get("description") or "", "parameters": params}


def call_schema(specs: tuple[dict, ...]) -> dict:
    """The JSON schema of one call of any of these tools."""
    calls = [{"type": "object", "properties": {"name": {"const": s["name"]},
                                               "arguments": s["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False}
             for s in specs]
    return (calls[0] if len(calls) == 1 else {"anyOf": calls}) | {"x-guidance": COMPACT}


def _tools_grammar(specs: tuple[dict, ...], choice: str) -> str:
    schema = call_schema(specs)
    if choice != "auto":
        return _grammar_text(schema, "tools")
    from llguidance import LLMatcher  # lazy: only a request with tools loads llguidance

    lark = f"start: call | text\ncall: %json {json.dumps(schema)}\ntext: /[^{{](.|\\n)*/\n"
    return LLMatcher.grammar_from_lark(lark)


def _grammar_text(schema: dict | None, param: str) -> str:
    """The grammar of JSON valid against `schema`, not yet checked (_matcher does)."""
    try:
        return json_grammar(schema, COMPACT, check=False)
    except GrammarError as e:
        raise ApiError(400, f"'{param}': {e}", param, code="invalid_schema") from None


def _matcher(grammar: str, param: str, tokenizer=None):
    """The grammar's matcher at the start of text (its lexer built over `tokenizer`'s
    vocabulary, None: the bytes'); ApiError 400 naming `param` when it cannot be compiled or
    generates nothing."""
    try:
        pristine = new_matcher(tokenizer, grammar)
        check_generates(grammar, pristine)
    except GrammarError as e:
        raise ApiError(400, f"'{param}': {e}", param, code="invalid_schema") from None
    return pristine


def tool_calls(text: str, tools: Tools) -> list[dict] | None:
    """The answer's tool call in OpenAI's form, or None when it is text (or, cut short by
    max_tokens, not a whole call)."""
    if not text.startswith("{"):
        return None
    try:
        call = json_text.loads(text)
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("name") not in {s["name"] for s in tools.specs}:
        return None
    return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
             "function": {"name": call["name"],
                          "arguments": json.dumps(call.get("arguments", {}))}}]


def tools_prompt(specs: tuple[dict, ...]) -> str:
    """What a system message tells the model of its tools, for a chat template that does not
    take `tools` itself."""
    listed = "\n".join(json.dumps(s) for s in specs)
    return ("You can call these functions. To call one, answer with only a JSON object "
            '{"name": <function name>, "arguments": <its arguments>}.\n' + listed)
