"""HTTP routes of the local OpenAI-compatible server (Starlette), and its metrics."""

from __future__ import annotations

import contextlib
import json
import logging

import grpc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from acespec.edge.openai_types import ApiError, parse_request
from acespec.edge.server import EdgeService, complete, stream

log = logging.getLogger(__name__)


class EdgeMetrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter

        r = self.registry = CollectorRegistry()
        self.requests = Counter("acespec_edge_requests", "HTTP requests", ["endpoint", "status"],
                                registry=r)
        self.tokens = Counter("acespec_edge_tokens", "Completion tokens", registry=r)
        self.drafted = Counter("acespec_edge_drafted_tokens", "Drafted tokens", registry=r)
        self.accepted = Counter("acespec_edge_accepted_tokens", "Accepted drafts", registry=r)
        self.target_forwards = Counter("acespec_edge_target_forwards",
                                       "Verifier scoring passes", registry=r)
        self.cache_hits = Counter("acespec_edge_cache_hits", "State-cache hits", registry=r)
        self.wire = Counter("acespec_edge_wire_bytes", "Bytes to/from the verifier",
                            ["direction"], registry=r)
        self.reconnects = Counter("acespec_edge_cloud_reconnects", "Verifier reconnects",
                                  registry=r)

    def record(self, u: dict) -> None:
        self.tokens.inc(u["completion_tokens"])
        self.drafted.inc(u["drafted_tokens"])
        self.accepted.inc(u["accepted_tokens"])
        self.target_forwards.inc(u["target_forwards"])
        self.cache_hits.inc(u["cache_hits"])
        self.wire.labels("up").inc(u["wire_bytes_up"])
        self.wire.labels("down").inc(u["wire_bytes_down"])
        self.reconnects.inc(u["cloud_reconnects"])

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def create_app(svc: EdgeService) -> Starlette:
    async def completions(request: Request, chat: bool):
        endpoint = "chat" if chat else "completions"
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ApiError(400, "request body is not valid JSON") from None
            req = parse_request(body, chat, svc.render_chat)
            if req.model != svc.model_name:
                raise ApiError(404, f"model {req.model!r} does not exist; this server serves "
                               f"{svc.model_name!r}", "model", code="model_not_found")
            if req.stream:
                svc.metrics.requests.labels(endpoint, "200").inc()
                return StreamingResponse(_guarded(stream(svc, req)), media_type="text/event-stream")
            resp = JSONResponse(await complete(svc, req))
        except ApiError as e:
            resp = JSONResponse(e.body(), status_code=e.status)
        except (ConnectionError, grpc.aio.AioRpcError) as e:
            resp = _cloud_error(e)
        except Exception:  # noqa: BLE001 - never a traceback in a response
            log.exception("request failed")
            resp = JSONResponse(ApiError(500, "internal error (see the server log)",
                                         kind="server_error").body(), status_code=500)
        svc.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
        return resp

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": svc.model_name, "object": "model", "created": 0, "owned_by": "acespec"}]})

    async def health(_: Request):
        return JSONResponse({"status": "ok", "model": svc.model_name})

    async def metrics(_: Request):
        return PlainTextResponse(svc.metrics.text(), media_type="text/plain; version=0.0.4")

    async def text_completions(request: Request):
        return await completions(request, chat=False)

    async def chat_completions(request: Request):
        return await completions(request, chat=True)

    routes = [
        Route("/v1/completions", text_completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await svc.aclose()  # the channel was made in this loop; close it in this loop

    return Starlette(routes=routes, lifespan=lifespan)


def _cloud_error(e: Exception) -> JSONResponse:
    if isinstance(e, grpc.aio.AioRpcError) and e.code() != grpc.StatusCode.UNAVAILABLE:
        return JSONResponse(ApiError(502, f"the verifier refused the request "
                                     f"({e.code().name}): {e.details()}", kind="upstream_error")
                            .body(), status_code=502)
    return JSONResponse(ApiError(503, "the cloud verifier is unreachable; retry shortly",
                                 kind="service_unavailable").body(), status_code=503)


async def _guarded(events):
    """Errors after the stream started become an error event, then [DONE]."""
    try:
        async for e in events:
            yield e
    except (ConnectionError, grpc.aio.AioRpcError) as e:
        yield f"data: {json.dumps(json.loads(_cloud_error(e).body))}\n\n"
        yield "data: [DONE]\n\n"
