"""The OpenAI stream's events as Ollama's newline-delimited JSON (acespec.edge.api.ollama):
keep-alives and notes dropped, the usage chunk made the last object, an error after the
stream started made one last line {"error": ...}."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("starlette")
grpc = pytest.importorskip("grpc")

from acespec.edge.api.ollama import _ndjson, _objects  # noqa: E402
from acespec.edge.api.ollama_types import parse_ollama  # noqa: E402
from acespec.edge.api.service import ShuttingDown  # noqa: E402


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def chunk(content: str, finish: str | None = None, chat: bool = True) -> str:
    said = {"delta": {"content": content}} if chat else {"text": content}
    return sse({"choices": [{"index": 0, **said, "finish_reason": finish}]})


def stream(chat: bool = True) -> list[str]:
    """What service.stream sends for "Hello" (with include_usage)."""
    return [chunk("", chat=chat), ": keep-alive\n\n", chunk("Hel", chat=chat),
            ": verifier back after 1.0 s\n\n", chunk("lo", "stop", chat),
            sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
            "data: [DONE]\n\n"]


async def events(items, error: Exception | None = None):
    for e in items:
        yield e
    if error is not None:
        raise error


def lines(o, items, error=None) -> list[dict]:
    async def go():
        out = [x async for x in _ndjson(_objects(o, events(items, error), 0, 0), o.req)]
        assert all(x.endswith("\n") and x.count("\n") == 1 for x in out)
        return [json.loads(x) for x in out]
    return asyncio.run(go())


def request(chat: bool):
    body = {"model": "m", **({"messages": [{"role": "user", "content": "hi"}]} if chat
                             else {"prompt": "hi", "raw": True})}
    return parse_ollama(body, chat, lambda m, t=None: [("hi", False)], True)


def test_text_then_the_last_object():
    out = lines(request(True), stream())
    assert [x["message"]["content"] for x in out] == ["Hel", "lo", ""]
    assert [x["done"] for x in out] == [False, False, True]
    assert out[-1]["done_reason"] == "stop" and out[-1]["eval_count"] == 2
    gen = lines(request(False), stream(chat=False))  # generate, raw: a completions stream
    assert [x["response"] for x in gen] == ["Hel", "lo", ""]


@pytest.mark.parametrize("error,said", [
    (ShuttingDown(), "shutting down"),
    (ConnectionError("gone"), "unreachable"),
    (RuntimeError("bug"), "internal error")])
def test_an_error_midway_is_the_last_line(error, said):
    out = lines(request(True), stream()[:3], error)
    assert out[0]["message"]["content"] == "Hel"
    assert list(out[-1]) == ["error"] and said in out[-1]["error"]
