"""Chat messages of a request, checked and reduced to {role, content: text} for the template.

Content is a string or a list of content parts, as OpenAI's API takes it. Text parts are
joined in order with PART_SEPARATOR, as vLLM and llama.cpp's server do for a template that
takes string content; any other part (image_url, input_audio, file, refusal, ...) is a 400
naming its type and index: this server serves a text model. What content spells stays text
(see edge.text.chat_segments).
"""

from __future__ import annotations

import json

from acespec.edge.api import json_text
from acespec.edge.api.errors import ApiError, text
from acespec.edge.api.params import is_off, off_values

# role sent -> role the template sees; "developer" is OpenAI's newer name for "system"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
PART_SEPARATOR = "\n"
# Message fields this server does not take, accepted only at these "off" values (or null).
MESSAGE_OFF: dict[str, tuple] = {"name": (), "function_call": (), "refusal": (), "audio": ()}


def parse_messages(msgs) -> list[dict]:
    """[{role, content}] with roles mapped by ROLES and content as one string; ApiError 400
    naming the first field that is wrong (e.g. `messages[1].content[2]`). An assistant's
    tool calls become its content, each call the JSON object the model answers with
    (edge.api.structured); a tool message's content is the call's result."""
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects",
                       "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]


def _message(m, at: str) -> dict:
    if not isinstance(m, dict):
        raise ApiError(400, f"'{at}' must be an object {{role, content}}", at)
    role = m.get("role")
    if role == "function":
        raise ApiError(400, f"'{at}.role' is 'function': the deprecated function messages are "
                       "not supported by this server (send tool messages)", f"{at}.role",
                       code="unsupported_parameter")
    if not isinstance(role, str) or role not in ROLES:
        raise ApiError(400, f"'{at}.role' must be one of {', '.join(ROLES)}, got "
                       f"{role!r:.40}", f"{at}.role")
    own = {"role", "content"} | ({"tool_calls"} if role == "assistant" else set()) | \
        ({"tool_call_id"} if role == "tool" else set())
    for key, value in m.items():
        if key in own:
            continue
        if key not in MESSAGE_OFF:
            raise ApiError(400, f"'{at}.{key:.40}' is not a field of a {role} message",
                           f"{at}.{key:.40}", code="unknown_parameter")
        if not is_off(value, MESSAGE_OFF[key]):
            raise ApiError(400, f"'{at}.{key}' is not supported by this server (accepted only "
                           f"as {off_values(MESSAGE_OFF[key])})", f"{at}.{key}",
                           code="unsupported_parameter")
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise ApiError(400, f"'{at}.tool_call_id' is required", f"{at}.tool_call_id")
    calls = m.get("tool_calls") or []
    if calls:
        said = "" if m.get("content") is None else _content(m["content"], f"{at}.content")
        content = "\n".join(filter(None, [said, *(
            _call_text(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(calls))]))
    else:
        content = _content(m.get("content"), f"{at}.content")
    return {"role": ROLES[role], "content": content}


def _call_text(call, at: str) -> str:
    """An earlier tool call as the model wrote it: {"name": ..., "arguments": {...}}."""
    f = call.get("function") if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise ApiError(400, f"'{at}' must be {{id, type: function, function: {{name, "
                       "arguments}}}}", at)
    try:
        arguments = json_text.loads(f.get("arguments") or "{}")
    except (TypeError, ValueError):
        raise ApiError(400, f"'{at}.function.arguments' must be a JSON text",
                       f"{at}.function.arguments") from None
    return json.dumps({"name": f["name"], "arguments": arguments}, separators=(",", ":"))


def _content(content, at: str) -> str:
    if isinstance(content, str):
        return text(content, at)
    if content is None:  # OpenAI allows it only beside tool_calls
        raise ApiError(400, f"'{at}' is required (null only beside tool_calls)", at)
    if not isinstance(content, list) or not content:
        raise ApiError(400, f"'{at}' must be a string or a non-empty list of content parts",
                       at)
    return PART_SEPARATOR.join(_text_part(p, f"{at}[{j}]") for j, p in enumerate(content))


def _text_part(part, at: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(kind, str):
        raise ApiError(400, f"'{at}' must be a content part {{type, ...}}", at)
    if kind != "text":
        raise ApiError(400, f"'{at}' has type {kind[:40]!r}: this server takes text parts "
                       "only", at, code="unsupported_content_part")
    extra = next((k for k in part if k not in ("type", "text")), None)
    if extra is not None:
        raise ApiError(400, f"'{at}.{extra:.40}' is not a field of a text part", f"{at}.{extra:.40}",
                       code="unknown_parameter")
    return text(part.get("text"), f"{at}.text")
