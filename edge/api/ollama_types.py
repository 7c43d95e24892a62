"""Ollama's /api/chat and /api/generate as the OpenAI path's requests, and the OpenAI stream's
chunks as Ollama's objects (no web framework here).

An Ollama body becomes the /v1/chat/completions or /v1/completions body that asks for the
same thing, which openai_types.parse_request checks and turns into a CompletionRequest, so
both APIs share one set of rules; an error it raises names the OpenAI field, which
`error_body` renames to the Ollama one (`max_tokens` -> `options.num_predict`). A field of
an Ollama body is honoured, accepted only at a value that means "off", or refused with a 400
naming it, as on the OpenAI path (params.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from acespec.edge.api.errors import ApiError, text
from acespec.edge.api.openai_types import CompletionRequest, parse_request
from acespec.edge.api.params import check_off

CHAT_FIELDS = frozenset({"model", "messages", "tools", "format", "options", "stream",
                         "keep_alive"})
GENERATE_FIELDS = frozenset({"model", "prompt", "system", "raw", "format", "options", "stream",
                             "keep_alive"})
# Fields accepted only at these "off" values (or null): a text model that does not think,
# served without log-probabilities, fill-in-the-middle, Go templates or token contexts.
OFF: dict[str, tuple] = {"think": (False,), "logprobs": (False,), "top_logprobs": (0,),
                         "suffix": ("",), "template": ("",), "context": ([],)}
# Ollama's options -> the OpenAI field each becomes
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
           "num_predict": "max_tokens", "stop": "stop", "repeat_penalty": "repetition_penalty",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
# Options accepted only at what this server does anyway: penalties over the whole text
# (repeat_last_n -1), and no typical, tail-free, min-p or mirostat sampling.
OPTIONS_OFF: dict[str, tuple] = {"repeat_last_n": (-1,), "typical_p": (1,), "tfs_z": (1,),
                                 "min_p": (0,), "mirostat": (0,), "penalize_newline": (False,)}
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}  # Ollama's, where options omit them
OPEN_LENGTH = 4096  # num_predict -1 or -2: the most max_tokens the OpenAI path takes
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}  # from finish_reason
# OpenAI field -> the Ollama field an error should name
RENAMED = {**{v: f"options.{k}" for k, v in OPTIONS.items()},
           "response_format.json_schema.schema": "format", "response_format": "format"}
_RENAME = re.compile("'(" + "|".join(sorted(map(re.escape, RENAMED), key=len, reverse=True))
                     + r")(?=['\[])")


@dataclass(frozen=True)
class OllamaRequest:
    model: str  # as the client named it (responses echo it)
    chat: bool  # /api/chat; else /api/generate
    stream: bool  # newline-delimited JSON objects; else one object
    req: CompletionRequest | None  # None: no prompt, only the model-load answer
    open_length: bool  # num_predict unset, -1 or -2: as long as the context allows


def parse_ollama(body, chat: bool, render_chat, templated: bool) -> OllamaRequest:
    """Validate an /api/chat or /api/generate body (`templated`: the model has a chat
    template); ApiError 400 naming the Ollama field."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", "model")
    _check_fields(body, CHAT_FIELDS if chat else GENERATE_FIELDS)
    _keep_alive(body.get("keep_alive"))
    stream = body.get("stream", True)
    if not isinstance(stream, bool | None):
        raise ApiError(400, f"'stream' must be a boolean (true or false), got {stream!r:.40}",
                       "stream")
    stream = stream is not False
    options, open_length = _options(body.get("options"))
    openai = {"model": model, **options, "stream": True, "offline": "wait",
              "stream_options": {"include_usage": True}}
    fmt = _format(body.get("format"))
    if fmt is not None:
        openai["response_format"] = fmt
    if chat:
        as_chat, prompt = True, _chat(body, openai)
        if prompt and not templated:
            raise ApiError(400, f"model {model[:80]!r} has no chat template; use /api/generate "
                           "(its prompt goes to the model as it is)", "messages")
    else:
        as_chat, prompt = _generate(body, openai, templated)
    if not prompt:  # Ollama loads the model and answers done_reason "load"
        return OllamaRequest(model, chat, stream, None, open_length)
    if open_length:
        openai["max_tokens"] = 1  # the prompt must leave room for one (set after tokenizing)
    req = parse_request(openai, as_chat, render_chat)
    return OllamaRequest(model, chat, stream, req, open_length)


def open_tokens(req: CompletionRequest, prompt_tokens: int, ctx_per_request: int
                ) -> CompletionRequest:
    """num_predict -1 or -2: up to what the context leaves (at most OPEN_LENGTH)."""
    return replace(req, max_tokens=max(1, min(OPEN_LENGTH, ctx_per_request - prompt_tokens)))


def served_name(name: str, served: tuple[str, ...]) -> bool:
    """Whether `name` is served, Ollama's default tag included (`acespec:latest`)."""
    return name in served or name.removesuffix(":latest") in served


def _check_fields(body: dict, honoured: frozenset) -> None:
    for name, value in body.items():
        if name in honoured:
            continue
        if name == "images":
            if value:
                raise ApiError(400, "'images': this server serves a text model; images are "
                               "not accepted", "images", code="unsupported_parameter")
        elif name in OFF:
            check_off(name, value, OFF[name])
        else:
            raise ApiError(400, f"'{name:.80}' is not a field this server takes (it takes "
                           f"{', '.join(sorted(honoured))})", name[:80],
                           code="unknown_parameter")


def _keep_alive(value) -> None:
    """Accepted and moot: the model stays loaded while the server runs."""
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, str | int | float)):
        raise ApiError(400, "'keep_alive' must be a duration (\"5m\") or a number of seconds",
                       "keep_alive")


def _options(options) -> tuple[dict, bool]:
    """(the OpenAI fields of Ollama's options, whether the answer's length is open)."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ApiError(400, "'options' must be an object", "options")
    out = dict(DEFAULTS)
    for name, value in options.items():
        at = f"options.{name:.40}"
        if value is None:  # unset (clients that fill in every option send these)
            continue
        if name in OPTIONS:
            out[OPTIONS[name]] = value
        elif name in OPTIONS_OFF:
            check_off(at, value, OPTIONS_OFF[name])
        else:
            hint = " (the context per request is edge serve --ctx-per-request)" \
                if name == "num_ctx" else ""
            raise ApiError(400, f"'{at}' is not an option this server takes{hint}; it takes "
                           f"{', '.join([*OPTIONS, *OPTIONS_OFF])}", at,
                           code="unknown_parameter")
    if _is_int(out.get("seed")) and out["seed"] == -1:  # Ollama's "random"
        del out["seed"]
    length = out.get("max_tokens")
    open_length = length is None or (_is_int(length) and length in (-1, -2))
    if open_length:
        out.pop("max_tokens", None)
    return out, open_length


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _format(value) -> dict | None:
    """Ollama's `format` as OpenAI's response_format."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}
    raise ApiError(400, f"'format' must be \"json\" or a JSON schema object, got "
                   f"{value!r:.40}", "format")


def _chat(body: dict, openai: dict) -> bool:
    """Fill `openai` with the chat's messages and tools; whether there is a prompt."""
    msgs = body.get("messages")
    if msgs is None or msgs == []:
        return False
    if not isinstance(msgs, list):
        raise ApiError(400, "'messages' must be a list of {role, content} objects", "messages")
    openai["messages"] = [_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
    if body.get("tools") is not None:
        openai["tools"] = body["tools"]  # Ollama's tools are OpenAI's function tools
    return True


def _message(m, at: str) -> dict:
    """An Ollama message as OpenAI's (parse_messages checks the rest)."""
    if not isinstance(m, dict):
        raise ApiError(400, f"'{at}' must be an object {{role, content}}", at)
    role = m.get("role")
    out = {"role": role}
    for key, value in m.items():
        if key in ("role", "content", "tool_calls"):
            continue
        if key == "images":
            if value:
                raise ApiError(400, f"'{at}.images': this server serves a text model; images "
                               "are not accepted", f"{at}.images", code="unsupported_parameter")
        elif key == "thinking":
            if value not in (None, ""):
                raise ApiError(400, f"'{at}.thinking' is not supported by this server "
                               "(accepted only as null or \"\")", f"{at}.thinking",
                               code="unsupported_parameter")
        elif key == "tool_name" and role == "tool":
            if value is not None:
                out["tool_call_id"] = text(value, f"{at}.tool_name")
        else:
            raise ApiError(400, f"'{at}.{key:.40}' is not a field of a {role!s:.20} message",
                           f"{at}.{key:.40}", code="unknown_parameter")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise ApiError(400, f"'{at}.content' must be a string", f"{at}.content")
    calls = m.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ApiError(400, f"'{at}.tool_calls' must be a list", f"{at}.tool_calls")
    if calls:  # (parse_messages refuses them on a message that is not the assistant's)
        out["tool_calls"] = [_call(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(calls)]
    out["content"] = content if content is not None or calls else ""
    if role == "tool":
        out.setdefault("tool_call_id", "")
    return out


def _call(call, at: str) -> dict:
    """An Ollama tool call ({function: {name, arguments: {...}}}) as OpenAI's."""
    f = call.get("function") if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise ApiError(400, f"'{at}' must be {{function: {{name, arguments}}}}", at)
    arguments = f.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ApiError(400, f"'{at}.function.arguments' must be an object",
                       f"{at}.function.arguments")
    return {"id": str(call.get("id") or ""), "type": "function",
            "function": {"name": f["name"], "arguments": json.dumps(arguments)}}


def _generate(body: dict, openai: dict, templated: bool) -> tuple[bool, bool]:
    """Fill `openai` with the prompt: through the chat template (as one user message after
    `system`), or as it is with `raw` or a model without a template. (as chat, whether there
    is a prompt)."""
    prompt, system, raw = body.get("prompt"), body.get("system"), body.get("raw")
    if not isinstance(raw, bool | None):
        raise ApiError(400, f"'raw' must be a boolean (true or false), got {raw!r:.40}", "raw")
    if prompt is None or prompt == "":
        return False, False
    text(prompt, "prompt")
    if system is not None:
        text(system, "system")
    if raw or not templated:
        if system:
            raise ApiError(400, "'system' goes into the chat template, and this prompt takes "
                           "none (" + ("raw" if raw else "the model has no chat template")
                           + ")", "system")
        openai.update(prompt=prompt, parse_special=bool(raw))  # raw: the caller's markup
        return False, True
    openai["messages"] = [*([{"role": "system", "content": system}] if system else []),
                          {"role": "user", "content": prompt}]
    return True, True


def error_body(e: ApiError) -> dict:
    """Ollama's error shape, the field named as Ollama names it."""
    return {"error": _RENAME.sub(lambda m: "'" + RENAMED[m.group(1)], e.message)}


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Piece:
    """What one OpenAI stream chunk carries, in Ollama's terms."""

    text: str = ""
    calls: list | None = None  # Ollama's tool calls
    done_reason: str | None = None
    usage: dict | None = None  # the last chunk: the request's usage


def piece_of(chunk: dict) -> Piece:
    """An OpenAI stream chunk (chat or completions, one choice) as a Piece."""
    if not chunk["choices"]:
        return Piece(usage=chunk.get("usage"))
    c = chunk["choices"][0]
    delta = c.get("delta", {})
    calls = delta.get("tool_calls")
    return Piece(c.get("text") or delta.get("content") or "",
                 [ollama_call(x) for x in calls] if calls else None,
                 DONE_REASONS.get(c.get("finish_reason")))


def ollama_call(call: dict) -> dict:
    """An OpenAI tool call as Ollama's: arguments an object."""
    return {"id": call["id"], "function": {"index": call.get("index", 0),
                                           "name": call["function"]["name"],
                                           "arguments": json.loads(call["function"]["arguments"])}}


def reply(o: OllamaRequest, text_: str, calls: list | None = None) -> dict:
    """One object of an answer, not the last."""
    head = {"model": o.model, "created_at": created_at()}
    if not o.chat:
        return {**head, "response": text_, "done": False}
    message = {"role": "assistant", "content": text_}
    if calls:
        message["tool_calls"] = calls
    return {**head, "message": message, "done": False}


@dataclass(frozen=True)
class Timing:
    """Nanosecond clock readings of one request."""

    start: int  # the request arrived
    generating: int  # its prompt was ready
    first: int | None  # its first text
    end: int


def final(o: OllamaRequest, done_reason: str, usage: dict | None, t: Timing,
          text_: str = "", calls: list | None = None) -> dict:
    """The last object: done, why, counts and durations (what Ollama reports)."""
    first = t.first if t.first is not None else t.end
    out = {**reply(o, text_, calls), "done": True, "done_reason": done_reason}
    if usage is not None:
        out.update(total_duration=t.end - t.start, load_duration=t.generating - t.start,
                   prompt_eval_count=usage["prompt_tokens"],
                   prompt_eval_duration=first - t.generating,
                   eval_count=usage["completion_tokens"], eval_duration=t.end - first)
    return out


def whole(objects: list[dict]) -> dict:
    """An answer's objects (the last one done) as the one object of `stream: false`."""
    last = dict(objects[-1])
    said = [o.get("response", "") if "response" in o else o["message"]["content"]
            for o in objects[:-1]]
    calls = [c for o in objects[:-1] for c in o.get("message", {}).get("tool_calls", [])]
    if "response" in last:
        last["response"] = "".join(said)
    else:
        last["message"] = {"role": "assistant", "content": "".join(said)}
        if calls:
            last["message"]["tool_calls"] = calls
    return last


def iso_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def details() -> dict:
    """A model's `details` (what Ollama knows from a model file; a served name, here)."""
    return {"parent_model": "", "format": "gguf", "family": "", "families": None,
            "parameter_size": "", "quantization_level": ""}


def model_entry(name: str, created: int) -> dict:
    """One model of /api/tags (and, with more, of /api/ps)."""
    return {"name": name, "model": name, "modified_at": iso_time(created), "size": 0,
            "digest": hashlib.sha256(name.encode()).hexdigest(), "details": details()}
