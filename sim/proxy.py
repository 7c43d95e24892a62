"""The asyncio TCP proxy driver of the link emulator: real sockets, no root, any OS.

Bytes read on one side are cut into segments, each segment's departure time comes from the
direction's stage chain (acespec.sim.stages), and a writer delivers them at that time, in
order. It counts the bytes crossing it each way (what a WAN link carries: HTTP/2 and gRPC
framing included). With no link spec it is a plain counting proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from dataclasses import dataclass

from acespec.sim.stages import Chunk, Link, LinkSpec

SEGMENT = 1448  # bytes: a TCP segment's payload on a 1500-byte MTU


@dataclass
class ByteCounts:
    up: int = 0  # client -> server
    down: int = 0  # server -> client


class LinkProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, spec: LinkSpec | None = None, seed: int = 0):
        self.target = (target_host, target_port)
        self.listen = (listen_host, listen_port)
        self.spec, self.seed = spec, seed
        self.counts = ByteCounts()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._conn_ids = itertools.count()
        self._t0 = 0.0

    async def start(self) -> int:
        """Start listening; returns the bound port."""
        self._t0 = asyncio.get_running_loop().time()
        self._server = await asyncio.start_server(self._handle, *self.listen)
        return self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        links = self.spec.build(self.seed + next(self._conn_ids)) if self.spec else (None, None)
        tasks = [asyncio.create_task(self._pump(reader, up_writer, "up", links[0])),
                 asyncio.create_task(self._pump(up_reader, writer, "down", links[1]))]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:  # the proxy stops: asyncio's stream callback would
            for t in tasks:             # log a cancelled connection handler as an error
                t.cancel()
        finally:
            self._tasks.difference_update(tasks)

    async def _pump(self, src, dst, direction: str, link: Link | None):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        writer = asyncio.create_task(self._deliver(queue, dst))
        try:
            while data := await src.read(65536):
                setattr(self.counts, direction, getattr(self.counts, direction) + len(data))
                now = loop.time() - self._t0
                for i in range(0, len(data), SEGMENT):
                    piece = data[i:i + SEGMENT]
                    due = link(Chunk(len(piece), now)).t if link else now
                    queue.put_nowait((due, piece))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            queue.put_nowait(None)  # deliver what is in flight, then close: nothing is dropped
            with contextlib.suppress(Exception):
                await writer

    async def _deliver(self, queue: asyncio.Queue, dst: asyncio.StreamWriter):
        loop = asyncio.get_running_loop()
        try:
            while (item := await queue.get()) is not None:
                due, piece = item
                delay = due - (loop.time() - self._t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                dst.write(piece)
                await dst.drain()
        except ConnectionError:
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


class ProxyThread:
    """A LinkProxy on its own event loop in its own thread, for a proxy that shares a
    process with an edge: what the edge does on its loop (drafting a slow edge's chunk) then
    never holds the link's packets back, as it would not on a real WAN."""

    def __init__(self, *args, **kwargs):
        self.proxy = LinkProxy(*args, **kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="link-proxy", daemon=True)

    @property
    def counts(self) -> ByteCounts:
        return self.proxy.counts

    async def start(self) -> int:
        """Start the thread and the proxy in it; returns the bound port."""
        self._thread.start()
        return await self._call(self.proxy.start())

    async def stop(self) -> None:
        try:
            await self._call(self.proxy.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)

    async def _call(self, coro):
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            pending = asyncio.all_tasks(self._loop)
            for t in pending:
                t.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            self._loop.close()


class CountingProxy(LinkProxy):
    """A pass-through proxy that only counts bytes each way."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0):
        super().__init__(target_host, target_port, listen_host, listen_port, spec=None)
