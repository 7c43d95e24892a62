"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version) on
the edge's local server, beside the OpenAI API.

A chat or generate request becomes the OpenAI path's CompletionRequest (ollama_types) and
runs as an OpenAI stream would (service.stream), whose chunks become Ollama's objects:
newline-delimited JSON (`application/x-ndjson`) ending in one with `done: true`, or, with
`stream: false`, that last object alone carrying the whole answer. Refusals, admission,
cancellation when the client goes away and the verifier's errors are the OpenAI path's
(serving.py), told in Ollama's error shape `{"error": "..."}`. Ollama's stream cannot take
back text, so these requests wait out a verifier outage (`offline: wait`) whatever
`edge serve --offline` says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from acespec.edge.api.errors import ApiError
from acespec.edge.api.ollama_types import (
    OllamaRequest,
    Timing,
    details,
    error_body,
    final,
    iso_time,
    model_entry,
    open_tokens,
    parse_ollama,
    piece_of,
    reply,
    served_name,
    whole,
)
from acespec.edge.api.openai_types import CompletionRequest
from acespec.edge.api.service import EdgeService, stream
from acespec.edge.api.serving import (
    AdmittedStream,
    ClientGone,
    failure,
    read_json,
    unless_disconnected,
)

VERSION = "0.12.0"  # the Ollama release whose API this follows (/api/version)
NDJSON = "application/x-ndjson"
NEVER = "9999-12-31T23:59:59Z"  # /api/ps's expires_at: the model stays while the server runs
SHOW_FIELDS = frozenset({"model", "name", "verbose"})


def ollama_routes(svc: EdgeService) -> list[BaseRoute]:
    async def generation(request: Request, chat: bool) -> Response:
        start = time.monotonic_ns()
        try:
            o = parse_ollama(await read_json(request), chat, svc.render_chat,
                             bool(svc.chat_template))
            if not served_name(o.model, svc.served_names):
                raise _not_found(o.model)
            resp = _loaded(o, start) if o.req is None else await _answer(svc, request, o, start)
        except Exception as e:  # noqa: BLE001 - failure() logs what is not the client's
            resp = _error(failure(e))
        endpoint = "ollama_chat" if chat else "ollama_generate"
        svc.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
        return resp

    async def chat(request: Request) -> Response:
        return await generation(request, chat=True)

    async def generate(request: Request) -> Response:
        return await generation(request, chat=False)

    async def tags(_: Request) -> Response:
        return JSONResponse({"models": [model_entry(n, svc.created) for n in svc.served_names]})

    async def show(request: Request) -> Response:
        try:
            return JSONResponse(_show(svc, await read_json(request)))
        except ApiError as e:
            return _error(e)

    async def ps(_: Request) -> Response:
        return JSONResponse({"models": [{
            **model_entry(svc.model_name, svc.created), "expires_at": NEVER, "size_vram": 0,
            "context_length": svc.ctx_per_request}]})

    async def version(_: Request) -> Response:
        return JSONResponse({"version": VERSION})

    return [Route("/api/chat", chat, methods=["POST"]),
            Route("/api/generate", generate, methods=["POST"]),
            Route("/api/tags", tags), Route("/api/show", show, methods=["POST"]),
            Route("/api/ps", ps), Route("/api/version", version)]


async def _answer(svc: EdgeService, request: Request, o: OllamaRequest, start: int
                  ) -> Response:
    """Run the request as the OpenAI path runs a stream, and reshape what it says."""
    req = dataclasses.replace(o.req, model=svc.model_name)
    try:
        req = await svc.prepared(req)  # its grammar compiled, off the loop
        prompt = await asyncio.to_thread(svc.prompt_tokens, req)  # off the loop: it can be long
        if o.open_length:
            req = open_tokens(req, len(prompt), svc.ctx_per_request)
        release = svc.admit(req.n)
        objects = _objects(o, stream(svc, req, prompt, None), start, time.monotonic_ns())
        if o.stream:
            return AdmittedStream(_ndjson(objects, req), release, media_type=NDJSON)
        try:
            return JSONResponse(await unless_disconnected(request, _whole(objects),
                                                          svc.stopping))
        finally:
            release()
    except ClientGone:
        return PlainTextResponse("client closed the request", status_code=499)
    except Exception as e:  # noqa: BLE001 - failure() logs what is not the client's
        return _error(failure(e, req))


async def _objects(o: OllamaRequest, events, start: int, generating: int):
    """Ollama's objects from the OpenAI stream's events: one per piece of text (or the tool
    calls), then the last, done, with the counts from the stream's usage chunk."""
    first, done_reason = None, "stop"
    async for event in events:
        if not event.startswith("data: {"):  # keep-alives and notes; [DONE]
            continue
        p = piece_of(json.loads(event.removeprefix("data: ")))
        if p.text or p.calls:
            first = first or time.monotonic_ns()
            yield reply(o, p.text, p.calls)
        done_reason = p.done_reason or done_reason
        if p.usage is not None:
            yield final(o, done_reason, p.usage,
                        Timing(start, generating, first, time.monotonic_ns()))


async def _whole(objects) -> dict:
    return whole([x async for x in objects])


async def _ndjson(objects, req: CompletionRequest):
    """One JSON object a line; an error after the stream started is one last line
    {"error": ...}, as Ollama sends it."""
    try:
        async for x in objects:
            yield json.dumps(x, separators=(",", ":")) + "\n"
    except Exception as e:  # noqa: BLE001 - an error line, never a traceback
        yield json.dumps(error_body(failure(e, req))) + "\n"


def _loaded(o: OllamaRequest, start: int) -> Response:
    """No prompt: Ollama's answer that the model is loaded (it always is, here)."""
    now = time.monotonic_ns()
    body = final(o, "load", None, Timing(start, now, None, now))
    if o.stream:
        return Response(json.dumps(body) + "\n", media_type=NDJSON)
    return JSONResponse(body)


def _show(svc: EdgeService, body) -> dict:
    """/api/show: what Ollama tells of a model, as far as this server knows it."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    extra = next((k for k in body if k not in SHOW_FIELDS), None)
    if extra is not None:
        raise ApiError(400, f"'{extra:.80}' is not a field of /api/show (it takes model)",
                       extra[:80])
    name = body.get("model") or body.get("name")  # `name`: older clients
    if not isinstance(name, str):
        raise ApiError(400, "'model' is required", "model")
    if not served_name(name, svc.served_names):
        raise _not_found(name)
    return {"modelfile": f"# served by acespec edge serve\nFROM {svc.model_name}\n",
            "parameters": "", "template": svc.chat_template or "", "details": details(),
            "model_info": {"general.architecture": "acespec",
                           "general.basename": svc.model_name,
                           "acespec.context_length": svc.ctx_per_request},
            "capabilities": ["completion", "tools"] if svc.chat_template else ["completion"],
            "modified_at": iso_time(svc.created)}


def _not_found(name: str) -> ApiError:
    return ApiError(404, f"model {name[:80]!r} not found", "model", code="model_not_found")


def _error(e: ApiError) -> Response:
    return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)
