"""What every generating route shares, OpenAI's (app.py) and Ollama's (ollama.py): the JSON
body read, a request given up when its client goes away or the server stops, a stream that
gives its admission back however it ends, and a failure as the HTTP error its client reads."""

from __future__ import annotations

import asyncio
import logging

import grpc
from starlette.requests import Request
from starlette.responses import StreamingResponse

from acespec.edge.api import json_text
from acespec.edge.api.openai_types import ApiError, CompletionRequest
from acespec.edge.api.service import ShuttingDown
from acespec.edge.client import VerifierUnfit

log = logging.getLogger(__name__)
CLOUD_ERRORS = (ConnectionError, grpc.aio.AioRpcError, VerifierUnfit)  # what cloud_error maps
_CLIENT_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)
SHUTDOWN = ApiError(503, "the server is shutting down; retry elsewhere or later",
                    kind="service_unavailable", code="server_shutdown")


async def read_json(request: Request):
    try:
        return json_text.loads(await request.body())
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {e.start})") from None
    except json_text.TooDeep as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    except ValueError:  # JSONDecodeError, or an over-long integer
        raise ApiError(400, "request body is not valid JSON") from None


class ClientGone(Exception):
    """The client disconnected before its (non-streamed) response was ready."""


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone away (the body is already read: the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work, stop: asyncio.Event):
    """Await `work`, cancelling it if the client goes away first (a client that gives up
    must not keep drafter sequences and verifier sessions busy until its text is done), or
    the server is asked to stop (ShuttingDown)."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnect(request))
    halt = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({task, gone, halt}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        halt.cancel()
        task.cancel()  # a no-op once it is done
    if task in done:
        return task.result()
    raise ShuttingDown if halt in done else ClientGone


class AdmittedStream(StreamingResponse):
    """A stream that gives its admission back when it ends, however it ends (its body may
    never start when the client is already gone)."""

    def __init__(self, content, release, **kw):
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def failure(e: Exception, req: CompletionRequest | None = None) -> ApiError:
    """The error a request's client is told when serving it raised `e`: its own ApiError,
    the shutdown, the verifier's failure (cloud_error), else a 500 (logged, never a
    traceback in a response)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ShuttingDown):
        return SHUTDOWN
    if isinstance(e, CLOUD_ERRORS):
        return cloud_error(e, req)
    log.error("request failed", exc_info=e)
    return ApiError(500, "internal error (see the server log)", kind="server_error")


def cloud_error(e: Exception, req: CompletionRequest | None = None) -> ApiError:
    """What a verifier failure means to the HTTP client: its own request was too big or
    malformed (400, naming the field where the verifier's message says which), the verifier
    is busy or unreachable (503, retry), or the deployment is broken (502)."""
    if isinstance(e, VerifierUnfit):
        return ApiError(502, str(e), kind="upstream_error")
    if not isinstance(e, grpc.aio.AioRpcError) or e.code() == grpc.StatusCode.UNAVAILABLE:
        return ApiError(503, "the cloud verifier is unreachable; retry shortly",
                        kind="service_unavailable", headers={"Retry-After": "1"})
    code, details = e.code(), e.details() or ""
    refused = code in _CLIENT_CODES or code == grpc.StatusCode.RESOURCE_EXHAUSTED
    if refused and "grammar" in details and req is not None and req.structure is not None:
        return ApiError(400, f"the verifier refused the request's grammar: {details}",
                        req.structure.param, code="grammar_too_large"
                        if code == grpc.StatusCode.RESOURCE_EXHAUSTED or "more than" in details
                        else "invalid_schema")
    if refused and "prompt" in details:
        return ApiError(400, f"the verifier refused the request: {details}", "prompt",
                        code="context_length_exceeded")
    if code in _CLIENT_CODES:
        return ApiError(400, f"the verifier refused the request: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # e.g. full: max_sessions reached
        return ApiError(503, f"the verifier is busy: {details}; retry shortly",
                        kind="service_unavailable", headers={"Retry-After": "1"})
    return ApiError(502, f"the verifier refused the request ({code.name}): {details}",
                    kind="upstream_error")
