"""The chat page at `/`, served from files in the package."""

from __future__ import annotations

from starlette.routing import BaseRoute


def page_routes(svc) -> list[BaseRoute]:
    return []
