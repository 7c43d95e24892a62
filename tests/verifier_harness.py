"""Starts a real verifier (grpc.aio on a loopback socket) around a model for a test."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from acespec.cloud.serving.metrics import Metrics
from acespec.cloud.serving.server import ServerConfig, create_server
from acespec.cloud.verify.engine import Engine
from acespec.edge.client import channel


@contextlib.asynccontextmanager
async def running_verifier(model, vocab_hash: str, cfg: ServerConfig | None = None):
    """Yields (engine, 'host:port'); stops the server afterwards."""
    cfg = replace(cfg or ServerConfig(), host="127.0.0.1", port=0)
    metrics = Metrics.create()
    engine = Engine(model, vocab_hash, "test-model", cfg.limits, cfg.emulation, metrics)
    server, port = await create_server(engine, cfg)
    try:
        yield engine, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
        await engine.close_all()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


__all__ = ["running_verifier", "run", "channel"]
