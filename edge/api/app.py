"""HTTP routes of the local OpenAI-compatible server (Starlette), and its metrics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging

import uvicorn
from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from acespec.edge.api.guard import ApiGuard, GuardConfig
from acespec.edge.api.ollama import ollama_routes
from acespec.edge.api.openai_types import (
    ApiError,
    CompletionRequest,
    model_object,
    parse_request,
)
from acespec.edge.api.page import page_routes
from acespec.edge.api.service import EdgeService, ShuttingDown, complete, echo, stream
from acespec.edge.api.serving import (
    CLOUD_ERRORS,
    SHUTDOWN,
    AdmittedStream,
    ClientGone,
    cloud_error,
    read_json,
    unless_disconnected,
)

log = logging.getLogger(__name__)


class EdgeMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("acespec_edge_requests", "HTTP requests", ["endpoint", "status"],
                                registry=r)
        self.tokens = Counter("acespec_edge_tokens", "Completion tokens", registry=r)
        self.drafted = Counter("acespec_edge_drafted_tokens", "Drafted tokens", registry=r)
        self.accepted = Counter("acespec_edge_accepted_tokens", "Accepted drafts", registry=r)
        self.passes = Counter("acespec_edge_passes", "Verifier passes", registry=r)
        self.cache_hits = Counter("acespec_edge_cache_hits", "State-cache hits", registry=r)
        self.wire = Counter("acespec_edge_wire_bytes", "Bytes to/from the verifier",
                            ["direction"], registry=r)
        self.reconnects = Counter("acespec_edge_cloud_reconnects", "Verifier reconnects",
                                  registry=r)
        self.outages = Counter("acespec_edge_link_outages", "Times a generation's verifier "
                               "link went down", registry=r)
        self.offline_s = Counter("acespec_edge_link_down_seconds", "Generation-seconds spent "
                                 "with the verifier unreachable", registry=r)
        self.unverified = Counter("acespec_edge_unverified_tokens", "Tokens answered from the "
                                  "drafter alone while offline (--offline local), by what the "
                                  "verifier made of them", ["fate"], registry=r)

    def record(self, u: dict) -> None:
        self.tokens.inc(u["completion_tokens"])
        self.drafted.inc(u["drafted_tokens"])
        self.accepted.inc(u["accepted_tokens"])
        self.passes.inc(u["passes"])
        self.cache_hits.inc(u["cache_hits"])
        self.wire.labels("up").inc(u["wire_bytes_up"])
        self.wire.labels("down").inc(u["wire_bytes_down"])
        self.reconnects.inc(u["cloud_reconnects"])
        self.outages.inc(u["outages"])
        self.offline_s.inc(u["offline_seconds"])
        for fate in ("confirmed", "replaced", "left"):
            self.unverified.labels(fate).inc(u[f"unverified_{fate}"])

    def text(self) -> bytes:
        return generate_latest(self.registry)


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(svc: EdgeService, guard: GuardConfig | None = None):
    """The ASGI app: the routes, behind ApiGuard when `guard` is given (edge serve does)."""
    app = _routes(svc)
    return ApiGuard(app, guard) if guard is not None else app


def _routes(svc: EdgeService) -> Starlette:
    async def completions(request: Request, chat: bool):
        endpoint = "chat" if chat else "completions"
        req = None
        try:
            req = parse_request(await read_json(request), chat, svc.render_chat)
            if req.model not in svc.served_names:
                raise _no_such_model(svc, req.model)
            req = dataclasses.replace(req, model=svc.model_name)  # responses name it so
            if req.offline == "local" and svc.drafter is None:
                raise ApiError(400, "'offline': \"local\" answers from the drafter, and this "
                               "server has none (edge serve --mode ar)", "offline")
            req = await svc.prepared(req)  # its grammar compiled, off the loop
            prompt = await asyncio.to_thread(svc.prompt_tokens, req)  # off the loop: it can be long
            release = svc.admit(req.n)
            if req.stream:
                try:  # what can be refused is refused before the stream starts
                    echoed = await unless_disconnected(request, echo(svc, req, prompt),
                                                        svc.stopping) if req.echo else None
                except BaseException:
                    release()
                    raise
                svc.metrics.requests.labels(endpoint, "200").inc()
                return AdmittedStream(_guarded(stream(svc, req, prompt, echoed), req), release,
                                       media_type="text/event-stream")
            try:
                body = await unless_disconnected(request, complete(svc, req, prompt),
                                                  svc.stopping)
            finally:
                release()
            resp = JSONResponse(body)
        except ApiError as e:
            resp = _error(e)
        except ClientGone:
            resp = PlainTextResponse("client closed the request", status_code=499)
        except ShuttingDown:
            resp = _error(SHUTDOWN)
        except CLOUD_ERRORS as e:
            resp = _error(cloud_error(e, req))
        except Exception:  # noqa: BLE001 - never a traceback in a response
            log.exception("request failed")
            resp = _error(ApiError(500, "internal error (see the server log)",
                                   kind="server_error"))
        svc.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
        return resp

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [
            model_object(name, svc.created) for name in svc.served_names]})

    async def model(request: Request):
        name = request.path_params["name"]
        if name not in svc.served_names:
            return _error(_no_such_model(svc, name))
        return JSONResponse(model_object(name, svc.created))

    async def health(_: Request):
        """Liveness (always 200 while serving) with the verifier's state beside it."""
        ready = await svc.verifier_ready()
        link = svc.link.state()
        return JSONResponse({"status": "ok" if link["link"] == "up" else "degraded",
                             "model": svc.model_name,
                             "verifier": "ready" if ready else "unreachable", **link})

    async def ready(_: Request):
        """Readiness: 200 when the verifier answers, else 503 (a load balancer's probe)."""
        if await svc.verifier_ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "verifier unreachable"}, status_code=503)

    async def metrics(_: Request):
        return PlainTextResponse(svc.metrics.text(), media_type="text/plain; version=0.0.4")

    async def text_completions(request: Request):
        return await completions(request, chat=False)

    async def chat_completions(request: Request):
        return await completions(request, chat=True)

    routes = [
        Route("/v1/completions", text_completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models), Route("/v1/models/{name:path}", model),
        Route("/health", health), Route("/ready", ready),
        Route("/metrics", metrics),
        *ollama_routes(svc), *page_routes(svc),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await svc.aclose()  # the channel was made in this loop; close it in this loop

    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: _no_route, 405: _no_route})


async def _no_route(request: Request, exc: HTTPException) -> JSONResponse:
    """An unknown path (404) or a method a path does not take (405), in OpenAI's error shape
    (its clients read the JSON body of any error)."""
    if exc.status_code == 405:
        e = ApiError(405, f"{request.method} is not allowed on {request.url.path[:80]} (it "
                     f"takes {exc.headers.get('Allow', 'other methods')})",
                     code="method_not_allowed", headers=exc.headers)
    else:
        e = ApiError(404, f"no route {request.method} {request.url.path[:80]} on this server "
                     "(it serves /v1/completions, /v1/chat/completions, /v1/models, /health, "
                     "/ready, /metrics, and Ollama's /api/chat, /api/generate, /api/tags, "
                     "/api/show, /api/ps, /api/version)", code="not_found")
    if request.url.path.startswith("/api/"):  # Ollama's clients read {"error": "..."}
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)
    return _error(e)


def _no_such_model(svc: EdgeService, name: str) -> ApiError:
    """OpenAI's 404 for a model it does not serve (vLLM's too)."""
    return ApiError(404, f"The model {name[:80]!r} does not exist; this server serves "
                    f"{', '.join(repr(n) for n in svc.served_names)}", "model",
                    code="model_not_found")


async def _guarded(events, req: CompletionRequest):
    """Errors after the stream started become one error event, then [DONE]."""
    try:
        async for e in events:
            yield e
    except ApiError as e:
        yield _sse_error(e)
    except ShuttingDown:
        yield _sse_error(SHUTDOWN)
    except CLOUD_ERRORS as e:
        yield _sse_error(cloud_error(e, req))
    except Exception:  # noqa: BLE001 - never a traceback in a stream
        log.exception("stream failed")
        yield _sse_error(ApiError(500, "internal error (see the server log)",
                                  kind="server_error"))


def _sse_error(e: ApiError) -> str:
    return f"data: {json.dumps(e.body())}\n\ndata: [DONE]\n\n"


def serve(svc: EdgeService, guard: GuardConfig, host: str, port: int) -> None:
    """Run the app under uvicorn until SIGINT/SIGTERM. A request in flight does not hold a
    signal hostage: open streams end at once with an error event and [DONE], pending
    completions with a 503 (svc.begin_shutdown), and what is left is cancelled after 4 s."""
    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            svc.begin_shutdown()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(create_app(svc, guard), host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=4)).run()
