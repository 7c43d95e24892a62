"""What keeps a web page from driving the local API (an ASGI wrapper around the app).

A local HTTP server is reachable from any page the user's browser opens: a `text/plain` POST
is a CORS "simple request" that needs no preflight, and DNS rebinding lets a foreign site
name 127.0.0.1 under its own host name. So, before any route runs:
  * a request with an `Origin` header is refused (403) unless that origin was allowed
    (`edge serve --allow-origin`; default none: tools and editors send no Origin) or is the
    server's own: the Origin equals the request's scheme://Host and that Host is one the
    server names (its chat page, acespec.edge.api.page; a Host let in by `--allow-host '*'`
    alone does not count, since only the Host check stops DNS rebinding);
  * the `Host` header must name this server: localhost, a loopback address, the bound host,
    or one given with `--allow-host` (403 otherwise: DNS rebinding);
  * a POST must be `application/json` (415) of at most `max_body` bytes (413), read here
    whole, so no route ever holds an over-long body;
  * with `--api-key`, /v1/*, Ollama's /api/* and /metrics need `Authorization: Bearer KEY`
    (401), as vLLM and llama.cpp's server do for /v1/* (the usage counters are the key
    holders' business; `--metrics-without-key` serves /metrics to anyone, for a scraper
    that cannot send a key); /health and /ready stay open for probes.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class GuardConfig:
    hosts: frozenset[str] = LOOPBACK  # Host names accepted ("*": any)
    origins: frozenset[str] = frozenset()  # Origin values accepted ("*": any)
    api_key: str | None = None
    max_body: int = 4 << 20  # bytes of a POST body
    metrics_without_key: bool = False  # /metrics answers without the API key

    @classmethod
    def for_bind(cls, host: str, allow_hosts=(), allow_origins=(), api_key=None,
                 max_body: int = 4 << 20, metrics_without_key: bool = False) -> GuardConfig:
        return cls(LOOPBACK | {host.strip("[]")} | set(allow_hosts), frozenset(allow_origins),
                   api_key or None, max_body, metrics_without_key)

    def needs_key(self, path: str) -> bool:
        """Whether a request for `path` must carry the API key."""
        if not self.api_key:
            return False
        return path.startswith(("/v1/", "/api/")) or (
            path == "/metrics" and not self.metrics_without_key)


def _host_name(value: str) -> str:
    """'example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class ApiGuard:
    def __init__(self, app, cfg: GuardConfig):
        self.app, self.cfg = app, cfg

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is None and scope["method"] == "POST":
            body, refusal = await self._read_body(receive, headers)
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            return await _respond(send, *refusal, ollama=scope["path"].startswith("/api/"))
        await self.app(scope, receive, send)

    def _refusal(self, scope, headers: dict) -> tuple | None:
        c = self.cfg
        origin = headers.get("origin")
        if origin is not None and "*" not in c.origins and origin not in c.origins \
                and not self._same_origin(origin, scope, headers.get("host", "")):
            return (403, f"cross-origin request from {origin!r:.80} refused; allow it with "
                    "edge serve --allow-origin ORIGIN", "origin_not_allowed")
        host = _host_name(headers.get("host", ""))
        if "*" not in c.hosts and host not in c.hosts:
            return (403, f"Host {host!r:.80} is not this server's (DNS rebinding?); allow it "
                    "with edge serve --allow-host NAME", "host_not_allowed")
        if c.needs_key(scope["path"]):
            auth = headers.get("authorization", "")
            if not hmac.compare_digest(auth.encode(), f"Bearer {c.api_key}".encode()):
                return (401, "missing or wrong API key: send Authorization: Bearer KEY",
                        "invalid_api_key", {"www-authenticate": "Bearer"})
        if scope["method"] == "POST":
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                return (415, f"Content-Type must be application/json, got {ctype or 'none'!r}",
                        "unsupported_media_type")
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > c.max_body):
                return self._too_large()
        return None

    def _same_origin(self, origin: str, scope, host: str) -> bool:
        """Whether `origin` is this server's own (a page it served, calling it back): the
        request's scheme://Host, for a Host the server names itself."""
        own = f"{scope.get('scheme', 'http')}://{host}".lower()
        return bool(host) and origin.lower() == own and _host_name(host).lower() in self.cfg.hosts

    def _too_large(self) -> tuple:
        return (413, f"request body over {self.cfg.max_body} bytes (edge serve --max-body-bytes)",
                "request_too_large")

    async def _read_body(self, receive, headers) -> tuple[bytes, tuple | None]:
        parts, n = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return b"", (499, "client closed the request", "client_closed")
            chunk = msg.get("body", b"")
            n += len(chunk)
            if n > self.cfg.max_body:
                return b"", self._too_large()
            parts.append(chunk)
            if not msg.get("more_body"):
                return b"".join(parts), None


def _replay(body: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then what the client does next (a disconnect)
    return replayed


async def _respond(send, status: int, message: str, code: str, headers: dict | None = None,
                   ollama: bool = False):
    """The refusal in OpenAI's error shape, or Ollama's ({"error": message}) on its /api/*."""
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    body = json.dumps({"error": message} if ollama else {"error": {
        "message": message, "type": kind, "param": None, "code": code}}).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})
