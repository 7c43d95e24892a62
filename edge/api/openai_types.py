"""OpenAI-compatible request parsing and response shapes (no web framework here). Which
fields are honoured and which refused: params.py; chat messages: messages.py."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from acespec.edge.api.errors import ApiError, text
from acespec.edge.api.messages import parse_messages
from acespec.edge.api.params import check_fields
from acespec.edge.api.structured import (
    Structure,
    Tools,
    parse_tools,
    response_structure,
    tools_structure,
)
from acespec.shared.config import MAX_ADDITIVE, MAX_REPETITION, MIN_REPETITION, Penalties
from acespec.shared.logprobs import MAX_TOP_LOGPROBS

__all__ = ["ApiError", "CompletionRequest", "parse_request"]
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512  # OpenAI's limits, in characters
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats", "include_obfuscation")


@dataclass
class CompletionRequest:
    model: str
    prompt: str | list[tuple[str, bool]]  # text, or chat (text, is_markup) pieces
    chat: bool
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    sampling: str | None = None  # 'coupled' | 'exact'; None: the server's --sampling
    offline: str | None = None  # 'wait' | 'local'; None: the server's --offline
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens past the end-of-text token
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False  # a last chunk with the usage of the whole request
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage so far on every chunk
    user: str | None = None  # user, safety_identifier, metadata: logged with the request
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    parse_special: bool = False  # /v1/completions: control tokens spelled in the prompt count
    logprobs: int | None = None  # the target's logprobs, with this many alternatives per token
    penalties: Penalties = Penalties()  # presence, frequency, repetition (both sides apply them)
    structure: Structure | None = None  # what response_format or tools ask the answer to
    # follow (edge.api.structured); None: free text
    grammar: str | None = None  # the structure compiled (edge.api.grammar_work)
    tools: Tools | None = None  # the tools the answer may call (chat)
    echo: bool = False  # completions: the prompt comes back before the answer


def _num(body: dict, name: str, kind, default, lo=None, hi=None):
    value = body.get(name, default)
    if value is None:
        return default
    ok_types = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_types) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ApiError(400, f"'{name}' must be a {'integer' if kind is int else 'number'}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ApiError(400, f"'{name}' must be in [{lo}, {hi}], got {value}", name)
    return kind(value)


def _bool(obj: dict, name: str, default: bool, param: str | None = None) -> bool:
    """A JSON boolean: "false" (a string) is not false, and must not be read as true."""
    value = obj.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{param or name}' must be a boolean (true or false), got "
                       f"{type(value).__name__} {value!r:.40}", param or name)
    return value


def _optional_text(body: dict, name: str) -> str | None:
    return None if body.get(name) is None else text(body[name], name)


def parse_request(body, chat: bool, render_chat) -> CompletionRequest:
    """Validate a /v1/completions or /v1/chat/completions body; names the bad parameter."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", "model")
    check_fields(body, chat)
    structure = response_structure(body.get("response_format"))
    tools = parse_tools(body.get("tools"), body.get("tool_choice")) if chat else None
    _bool(body, "parallel_tool_calls", True)  # one call per answer either way
    if structure is not None and tools is not None:
        raise ApiError(400, "'response_format' and 'tools' each constrain the answer: send "
                       "one (or tool_choice: none)", "response_format")
    if tools is not None:
        structure = tools_structure(tools)
    if chat:
        prompt = render_chat(parse_messages(body.get("messages")), tools)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        prompt = text(prompt, "prompt")
    stream = _bool(body, "stream", False)
    usage_last, usage_each = _stream_options(body.get("stream_options"), stream)
    return CompletionRequest(
        model=model, prompt=prompt, chat=chat, max_tokens=_max_tokens(body, chat),
        temperature=_num(body, "temperature", float, 1.0, 0.0, 2.0),
        top_p=_num(body, "top_p", float, 1.0, 1e-6, 1.0),
        top_k=_num(body, "top_k", int, 0, 0, 4096),
        seed=_num(body, "seed", int, None, 0, 2**63 - 1),
        sampling=_one_of(body, "sampling", ("coupled", "exact")),
        offline=_one_of(body, "offline", ("wait", "local")), ignore_eos=_bool(body, "ignore_eos", False),
        n=_num(body, "n", int, 1, 1, 8), stop=_stop(body.get("stop")), stream=stream,
        include_usage=usage_last, continuous_usage=usage_each,
        user=_optional_text(body, "user"),
        safety_identifier=_optional_text(body, "safety_identifier"),
        metadata=_metadata(body.get("metadata")),
        parse_special=not chat and _bool(body, "parse_special", False),
        logprobs=_logprobs(body, chat), penalties=_penalties(body), structure=structure,
        tools=tools, echo=not chat and _bool(body, "echo", False))


def _penalties(body: dict) -> Penalties:
    return Penalties(
        presence=_num(body, "presence_penalty", float, 0.0, -MAX_ADDITIVE, MAX_ADDITIVE),
        frequency=_num(body, "frequency_penalty", float, 0.0, -MAX_ADDITIVE, MAX_ADDITIVE),
        repetition=_num(body, "repetition_penalty", float, 1.0, MIN_REPETITION,
                        MAX_REPETITION))


def _logprobs(body: dict, chat: bool) -> int | None:
    """Alternatives per token, or None when no logprobs are asked for. Chat: `logprobs`
    true|false and `top_logprobs` 0..20; completions: `logprobs` 0..20 (OpenAI's legacy
    field, its number of alternatives)."""
    if not chat:
        return _num(body, "logprobs", int, None, 0, MAX_TOP_LOGPROBS)
    top = _num(body, "top_logprobs", int, None, 0, MAX_TOP_LOGPROBS)
    if not _bool(body, "logprobs", False):
        if top:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def _max_tokens(body: dict, chat: bool) -> int:
    """max_completion_tokens (OpenAI's newer name), else max_tokens; both, unequal: 400."""
    new, old = body.get("max_completion_tokens"), body.get("max_tokens")
    if new is not None and old is not None and new != old:
        raise ApiError(400, f"'max_tokens' ({old!r:.20}) and 'max_completion_tokens' "
                       f"({new!r:.20}) differ; send one", "max_tokens")
    name = "max_completion_tokens" if new is not None else "max_tokens"
    # 0 only with echo: the prompt (and its logprobs) alone, as OpenAI allowed
    lo = 0 if not chat and body.get("echo") is True else 1
    return _num(body, name, int, 256 if chat else 16, lo, 4096)


def _stop(stop) -> list[str]:
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of up to 4 non-empty strings", "stop")
    return [text(x, f"stop[{i}]") for i, x in enumerate(stop)]


def _stream_options(options, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats). Only with stream: true, as OpenAI and vLLM
    have it; include_obfuscation is accepted as false only (no obfuscation is added)."""
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    if not stream:
        raise ApiError(400, "'stream_options' is allowed only with 'stream': true",
                       "stream_options")
    for key in options:
        if key not in STREAM_OPTIONS:
            raise ApiError(400, f"'stream_options.{key:.40}' is not a stream option this "
                           f"server knows ({', '.join(STREAM_OPTIONS)})",
                           f"stream_options.{key:.40}", code="unknown_parameter")
    if _bool(options, "include_obfuscation", False, "stream_options.include_obfuscation"):
        raise ApiError(400, "'stream_options.include_obfuscation' is not supported by this "
                       "server (accepted only as null or false)",
                       "stream_options.include_obfuscation", code="unsupported_parameter")
    return (_bool(options, "include_usage", False, "stream_options.include_usage"),
            _bool(options, "continuous_usage_stats", False,
                  "stream_options.continuous_usage_stats"))


def _metadata(value) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 and values up to 512
    characters (logged with the request; nothing is stored)."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > METADATA_PAIRS:
        raise ApiError(400, f"'metadata' must be an object of at most {METADATA_PAIRS} "
                       "string pairs", "metadata")
    for k, v in value.items():
        text(k, "metadata")
        text(v, f"metadata.{k:.40}")
        if len(k) > METADATA_KEY or len(v) > METADATA_VALUE:
            raise ApiError(400, f"'metadata' keys are at most {METADATA_KEY} characters and "
                           f"values at most {METADATA_VALUE}", f"metadata.{k:.40}")
    return dict(value)


def _one_of(body: dict, name: str, values: tuple[str, ...]) -> str | None:
    """One of AceSpec's extension fields: "sampling" ("coupled" | "exact", see `edge serve
    --sampling`), "offline" ("wait" | "local", see `edge serve --offline`); None if absent."""
    value = body.get(name)
    if value is not None and value not in values:
        allowed = " or ".join(f'"{v}"' for v in values)
        raise ApiError(400, f"'{name}' must be {allowed}, got {value!r:.40}", name)
    return value


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def model_object(name: str, created: int) -> dict:
    """One entry of /v1/models, and the body of /v1/models/{name}."""
    return {"id": name, "object": "model", "created": created, "owned_by": "acespec"}


def choice(req: CompletionRequest, index: int, text: str, finish: str | None, delta: bool) -> dict:
    if not req.chat:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
    if delta:
        return {"index": index, "delta": {"content": text} if text else {}, "finish_reason": finish}
    return {"index": index, "message": {"role": "assistant", "content": text},
            "finish_reason": finish}


def envelope(req: CompletionRequest, rid: str, choices: list[dict], chunk: bool,
             usage: dict | None = None) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if req.chat else "text_completion"
    out = {"id": rid, "object": kind, "created": int(time.time()), "model": req.model,
           "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt_tokens: int, stats_list: list) -> dict:
    """OpenAI usage plus the speculative figures, summed over the n choices."""
    tokens = sum(s.tokens for s in stats_list)
    rounds = sum(s.rounds for s in stats_list)
    hits = sum(s.cache.hits for s in stats_list)
    rejections = sum(s.cache.rejections for s in stats_list)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
            "total_tokens": prompt_tokens + tokens,
            "drafted_tokens": sum(s.drafted for s in stats_list),
            "accepted_tokens": sum(s.accepted for s in stats_list),
            "mean_acceptance_length": round(tokens / rounds, 3) if rounds else 0.0,
            "cache_hit_rate": round(hits / rejections, 3) if rejections else 0.0,
            "cache_hits": hits,
            "passes": sum(s.passes for s in stats_list),
            "wire_bytes_up": sum(s.wire_bytes_up for s in stats_list),
            "wire_bytes_down": sum(s.wire_bytes_down for s in stats_list),
            "cloud_reconnects": sum(s.reconnects for s in stats_list),
            **offline_usage(stats_list)}


def offline_usage(stats_list: list) -> dict:
    """The link's outages during the request and, in local offline mode, the tokens answered
    unverified: confirmed by the verifier as they were, replaced, or left unverified (the
    verifier never came back)."""
    return {"outages": sum(s.outages for s in stats_list),
            "offline_seconds": round(sum(s.offline_s for s in stats_list), 3),
            "unverified_tokens": sum(s.unverified_tokens for s in stats_list),
            "unverified_confirmed": sum(s.unverified_confirmed for s in stats_list),
            "unverified_replaced": sum(s.unverified_replaced for s in stats_list),
            "unverified_left": sum(len(s.unverified_tail) for s in stats_list)}
