"""Ollama's API (/api/chat, /api/generate, /api/tags, ...) on the edge's local server."""

from __future__ import annotations

from starlette.routing import BaseRoute


def ollama_routes(svc) -> list[BaseRoute]:
    return []
