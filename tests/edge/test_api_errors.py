"""What a verifier's refusal becomes for the HTTP client (acespec.edge.api.serving.cloud_error):
a grammar it refuses names the field that asked for it, a prompt it refuses names the
prompt, a busy or unreachable verifier is a 503 to retry, a broken deployment a 502."""

from __future__ import annotations

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("starlette")

from acespec.edge.api.openai_types import parse_request  # noqa: E402
from acespec.edge.api.serving import cloud_error  # noqa: E402

S = grpc.StatusCode


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def request(**fields):
    chat = "tools" in fields
    base = {"messages": [{"role": "user", "content": "q"}]} if chat else {"prompt": "x"}
    return parse_request({"model": "m", **base, **fields}, chat,
                         lambda messages, tools=None: [("q", False)])


FORMAT = {"response_format": {"type": "json_object"}}
TOOLS = {"tools": [{"type": "function", "function": {"name": "f"}}]}


@pytest.mark.parametrize("code,details,fields,status,param,err_code", [
    (S.INVALID_ARGUMENT, "sampling: grammar is 300000 characters, more than 262144", FORMAT,
     400, "response_format", "grammar_too_large"),
    (S.RESOURCE_EXHAUSTED, "grammar of this session costs too much", TOOLS,
     400, "tools", "grammar_too_large"),
    (S.INVALID_ARGUMENT, "sampling.grammar: the grammar cannot be used: x", FORMAT,
     400, "response_format", "invalid_schema"),
    (S.RESOURCE_EXHAUSTED, "prompt of 9000 tokens exceeds max_prompt_tokens=8192", {},
     400, "prompt", "context_length_exceeded"),
    (S.INVALID_ARGUMENT, "sampling: top_p must be in (0, 1], got 2.0", {}, 400, None, None),
    (S.RESOURCE_EXHAUSTED, "verifier is full: 64 sessions", {}, 503, None, None),
    (S.UNAVAILABLE, "connection refused", {}, 503, None, None),
    (S.FAILED_PRECONDITION, "this verifier has no tokenizer.json for structured output's "
     "grammars", FORMAT, 502, None, None),
])
def test_verifier_refusals_name_what_the_client_sent(code, details, fields, status, param,
                                                     err_code):
    e = cloud_error(rpc_error(code, details), request(**fields))
    assert (e.status, e.param, e.code) == (status, param, err_code), e.message
    assert status != 400 or details in e.message
