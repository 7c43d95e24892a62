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
import uuid
from dataclasses import dataclass

from acespec.edge.api.errors import ApiError
from acespec.shared.grammar import GrammarError, check_grammar, json_grammar

COMPACT = {"whitespace_flexible": False}  # JSON without spare whitespace: fewer tokens


@dataclass(frozen=True)
class Tools:
    """The tools a request offers and how the answer may use them."""

    specs: tuple[dict, ...]  # OpenAI function objects: {name, description?, parameters?}
    choice: str  # "auto" | "required" | "named"
    grammar: str


def response_grammar(value) -> str | None:
    """The grammar of `response_format` (None: free text); ApiError 400 naming the field."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ApiError(400, "'response_format' must be an object with a 'type'", "response_format")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return _compiled(None, "response_format")
    if kind != "json_schema":
        raise ApiError(400, f"'response_format.type' must be text, json_object or json_schema, "
                       f"got {kind!r:.40}", "response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ApiError(400, "'response_format.json_schema' must be an object with a 'schema' "
                       "object", "response_format.json_schema")
    return _compiled(spec.get("schema", {}), "response_format.json_schema.schema")


def parse_tools(tools, choice) -> Tools | None:
    """The request's tools under its tool_choice (None: no tool may be called); ApiError 400
    naming the field."""
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise ApiError(400, "'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function tools", "tools")
    specs = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ApiError(400, "'tools' name a function twice", "tools")
    choice = "auto" if choice is None else choice
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" \
            else None
        if name not in names:
            raise ApiError(400, f"'tool_choice' must name one of the tools ({', '.join(names)})",
                           "tool_choice")
        specs, choice = tuple(s for s in specs if s["name"] == name), "named"
    elif choice not in ("auto", "required"):
        raise ApiError(400, "'tool_choice' must be none, auto, required or "
                       "{type: function, function: {name}}", "tool_choice")
    return Tools(specs, choice, _tools_grammar(specs, choice))


def _tool(t, at: str) -> dict:
    if not isinstance(t, dict) or t.get("type") != "function" or \
            not isinstance(t.get("function"), dict):
        raise ApiError(400, f"'{at}' must be {{type: function, function: {{name, ...}}}}", at)
    f = t["function"]
    if not isinstance(f.get("name"), str) or not f["name"]:
        raise ApiError(400, f"'{at}.function.name' is required", f"{at}.function.name")
    params = f.get("parameters", {"type": "object"})
    if not isinstance(params, dict):
        raise ApiError(400, f"'{at}.function.parameters' must be a JSON schema object",
                       f"{at}.function.parameters")
    _compiled(params, f"{at}.function.parameters")
    return {"name": f["name"], "description": f.get("description", ""), "parameters": params}


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
        return _compiled(schema, "tools")
    from llguidance import LLMatcher  # lazy: only a request with tools loads llguidance

    lark = f"start: call | text\ncall: %json {json.dumps(schema)}\ntext: /[^{{](.|\\n)*/\n"
    try:
        grammar = LLMatcher.grammar_from_lark(lark)
        check_grammar(grammar)
    except (GrammarError, ValueError) as e:
        raise ApiError(400, f"the tools cannot be compiled to a grammar: {e}", "tools") from None
    return grammar


def _compiled(schema: dict | None, param: str) -> str:
    try:
        return json_grammar(schema, COMPACT)
    except GrammarError as e:
        raise ApiError(400, f"'{param}': {e}", param, code="invalid_schema") from None


def tool_calls(text: str, tools: Tools) -> list[dict] | None:
    """The answer's tool call in OpenAI's form, or None when it is text (or, cut short by
    max_tokens, not a whole call)."""
    if not text.startswith("{"):
        return None
    try:
        call = json.loads(text)
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
