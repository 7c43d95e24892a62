"""A TCP proxy that counts the bytes crossing it each way (what a WAN link would carry:
HTTP/2 and gRPC framing included). The link emulator builds its stages on this."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass
class ByteCounts:
    up: int = 0  # client -> server
    down: int = 0  # server -> client


class CountingProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0):
        self.target = (target_host, target_port)
        self.listen = (listen_host, listen_port)
        self.counts = ByteCounts()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        """Start listening; returns the bound port."""
        self._server = await asyncio.start_server(self._handle, *self.listen)
        return self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        tasks = [asyncio.create_task(self._pump(reader, up_writer, "up")),
                 asyncio.create_task(self._pump(up_reader, writer, "down"))]
        self._tasks.update(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.difference_update(tasks)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: str):
        try:
            while data := await src.read(65536):
                setattr(self.counts, direction, getattr(self.counts, direction) + len(data))
                dst.write(data)
                await dst.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._tasks):
            t.cancel()
