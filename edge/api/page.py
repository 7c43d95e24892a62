"""The chat page at `/`, served from files in the package (edge/api/static).

The page and its files carry no data, so they are served without the API key; the page asks
for the key when the server wants one and sends it with each request to /v1/*. It talks to
the same OpenAI API as any client, from the server's own origin (acespec.edge.api.guard lets
that origin in). Its Content-Security-Policy keeps it to this server: nothing is fetched from
anywhere else, and no inline script runs.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import PurePosixPath

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

STATIC = "static"  # the files' folder in this package
INDEX = "index.html"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
HEADERS = {
    "content-security-policy": "default-src 'self'; base-uri 'none'; object-src 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",  # a new version of the page shows on the next load
}


def static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files: name -> (content, content type), read once from the package."""
    out = {}
    for f in files(__package__).joinpath(STATIC).iterdir():
        kind = TYPES.get(PurePosixPath(f.name).suffix)
        if f.is_file() and kind is not None:
            out[f.name] = (f.read_bytes(), kind)
    if INDEX not in out:
        raise FileNotFoundError(f"the chat page's {STATIC}/{INDEX} is missing from "
                                f"{__package__}: a broken install")
    return out


def page_routes(svc) -> list[BaseRoute]:
    """GET / (the page) and GET /static/NAME (its script, style and icon). The page needs
    nothing of the service `svc`: it reaches the server through its API."""
    assets = static_files()

    def respond(name: str) -> Response:
        content, kind = assets[name]
        return Response(content, media_type=kind, headers=HEADERS)

    async def index(_: Request) -> Response:
        return respond(INDEX)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name == INDEX or name not in assets:
            raise HTTPException(404)
        return respond(name)

    return [Route("/", index), Route("/static/{name}", asset)]
