"""OpenAI-compatible request parsing and response shapes (no web framework here)."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from acespec.shared.config import with_deprecated


class ApiError(Exception):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers  # e.g. Retry-After on a 503

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


ROLES = ("system", "user", "assistant")
# OpenAI parameters this server does not implement, with the value that means "off" (those
# are accepted; anything else is a 400 naming the parameter, never silently ignored).
# logit_bias and the penalties would change the served distribution: they belong at the
# verifier, which does not take them; logprobs would need the verifier's distributions.
UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False),
               "best_of": (None, 1), "suffix": (None, ""), "logit_bias": (None, {}),
               "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
               "repetition_penalty": (None, 1), "tools": (None, []), "functions": (None, []),
               "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}),
               "min_p": (None, 0), "prediction": (None,)}


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
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens past the end-of-text token
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    parse_special: bool = False  # /v1/completions: control tokens spelled in the prompt count


def _text(value, param: str) -> str:
    """A string that is valid Unicode text (JSON can spell a lone surrogate, "\\ud800",
    which no tokenizer can encode): 400 naming the field otherwise."""
    if not isinstance(value, str):
        raise ApiError(400, f"'{param}' must be a string", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"'{param}' is not valid Unicode text: a lone surrogate "
                       f"(\\u{ord(value[e.start]):04x}) at character {e.start}", param) from None
    return value


def _unsupported(body: dict) -> None:
    for name, off in UNSUPPORTED.items():
        if name in body and not any(body[name] == v and type(body[name]) is type(v)
                                    for v in off if v is not None) and body[name] is not None:
            raise ApiError(400, f"'{name}' is not supported by this server (accepted only "
                           f"as {' or '.join(json_repr(v) for v in off)})", name,
                           code="unsupported_parameter")


def json_repr(v) -> str:
    import json

    return json.dumps(v)


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


def parse_request(body, chat: bool, render_chat) -> CompletionRequest:
    """Validate a /v1/completions or /v1/chat/completions body; names the bad parameter."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", "model")
    _unsupported(body)
    if chat:
        prompt = render_chat(_messages(body.get("messages")))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        prompt = _text(prompt, "prompt")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of up to 4 non-empty strings", "stop")
    stop = [_text(x, f"stop[{i}]") for i, x in enumerate(stop)]
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    default_max = 256 if chat else 16
    return CompletionRequest(
        model=model, prompt=prompt, chat=chat,
        max_tokens=_num(body, "max_completion_tokens" if "max_completion_tokens" in body else
                        "max_tokens", int, default_max, 1, 4096),
        temperature=_num(body, "temperature", float, 1.0, 0.0, 2.0),
        top_p=_num(body, "top_p", float, 1.0, 1e-6, 1.0),
        top_k=_num(body, "top_k", int, 0, 0, 4096),
        seed=_num(body, "seed", int, None, 0, 2**63 - 1),
        sampling=_sampling(body), ignore_eos=_bool(body, "ignore_eos", False),
        n=_num(body, "n", int, 1, 1, 8), stop=stop, stream=_bool(body, "stream", False),
        include_usage=_bool(options, "include_usage", False, "stream_options.include_usage"),
        user=body.get("user") if isinstance(body.get("user"), str) else None,
        parse_special=not chat and _bool(body, "parse_special", False))


def _messages(msgs) -> list[dict]:
    """Chat messages checked: roles from ROLES only (a role is template markup), content
    valid text (what it spells stays text: see edge.text.chat_segments)."""
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in msgs):
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects",
                       "messages")
    for i, m in enumerate(msgs):
        if m["role"] not in ROLES:
            raise ApiError(400, f"'messages[{i}].role' must be one of {', '.join(ROLES)}, got "
                           f"{m['role']!r:.40}", f"messages[{i}].role")
        _text(m["content"], f"messages[{i}].content")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def _sampling(body: dict) -> str | None:
    """AceSpec's extension: "sampling": "coupled" | "exact" (see `edge serve --sampling`)."""
    value = body.get("sampling")
    if value is not None and value not in ("coupled", "exact"):
        raise ApiError(400, f"'sampling' must be \"coupled\" or \"exact\", got {value!r}",
                       "sampling")
    return value


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


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
    return with_deprecated({"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                            "total_tokens": prompt_tokens + tokens,
                            "drafted_tokens": sum(s.drafted for s in stats_list),
                            "accepted_tokens": sum(s.accepted for s in stats_list),
                            "mean_acceptance_length": round(tokens / rounds, 3) if rounds else 0.0,
                            "cache_hit_rate": round(hits / rejections, 3) if rejections else 0.0,
                            "cache_hits": hits,
                            "passes": sum(s.passes for s in stats_list),
                            "wire_bytes_up": sum(s.wire_bytes_up for s in stats_list),
                            "wire_bytes_down": sum(s.wire_bytes_down for s in stats_list),
                            "cloud_reconnects": sum(s.reconnects for s in stats_list)})
