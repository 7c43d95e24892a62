"""The asyncio TCP proxy driver of the link emulator: real sockets, no root, any OS.

Bytes read on one side are cut into segments, each segment's departure time comes from the
direction's stage chain (acespec.sim.stages), and a writer delivers them at that time, in
order. It counts the bytes crossing it each way (what a WAN link carries: HTTP/2 and gRPC
framing included). With no link spec it is a plain counting proxy.

Two kinds of drop, for testing an edge offline: an outage (`cut`, or LinkSpec.outages), when
the link carries nothing but connections live on and TCP delivers everything once it is back;
and a reset (`reset`), when every connection dies at once (a verifier that vanished, a NAT
that rebound).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import threading
from dataclasses import dataclass, field

from acespec.sim.stages import Chunk, Link, LinkSpec, OutageSchedule

SEGMENT = 1448  # bytes: a TCP segment's payload on a 1500-byte MTU


@dataclass
class ByteCounts:
    up: int = 0  # client -> server
    down: int = 0  # server -> client


@dataclass(eq=False)
class _Conn:
    """One client connection: its sockets (client side, then target side) and its tasks."""

    writers: list[asyncio.StreamWriter]
    pumps: list[asyncio.Task] = field(default_factory=list)  # up, down
    tasks: set[asyncio.Task] = field(default_factory=set)  # pumps and their deliverers
    dead: asyncio.Event = field(default_factory=asyncio.Event)  # reset or the proxy stopped

    def abort(self) -> None:
        """A TCP reset on every socket; what is in flight is dropped."""
        self.dead.set()
        for w in self.writers:
            sock = w.get_extra_info("socket")
            if sock is not None:  # linger 0: close() sends RST, not FIN
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()
        for t in self.tasks:
            t.cancel()


class LinkProxy:
    """Listens on `listen`, forwards to `target` through `spec`'s link (seeded per
    connection). Its clock (`now`, seconds) reads `clock_s` at `start()` (a run may begin
    part-way into a trace); outage windows
    (`outage_schedule`: `spec.outages`, then `cut`) are on that clock and apply to every
    connection, both ways."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, spec: LinkSpec | None = None, seed: int = 0,
                 clock_s: float = 0.0):
        self.target = (target_host, target_port)
        self.clock_s = clock_s
        self.listen = (listen_host, listen_port)
        self.spec, self.seed = spec, seed
        self.counts = ByteCounts()
        self.outage_schedule = OutageSchedule.of(spec.outages if spec else ())
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[_Conn] = set()
        self._conn_ids = itertools.count()
        self._t0 = 0.0

    async def start(self) -> int:
        """Start listening; returns the bound port."""
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time() - self.clock_s
        self._server = await asyncio.start_server(self._handle, *self.listen)
        return self._server.sockets[0].getsockname()[1]

    def now(self) -> float:
        """Seconds on the link's clock: clock_s + since start() (0 before it)."""
        return self._loop.time() - self._t0 if self._loop else 0.0

    def cut(self, seconds: float) -> None:
        """Take the link down for `seconds` from now, both ways, for every connection: what
        is sent meanwhile waits and arrives, in order, once it is back (TCP retransmits it);
        a new connection hangs until then."""
        self.outage_schedule.add(self.now(), seconds)

    def reset(self) -> int:
        """Close every open connection abruptly (a TCP reset to both ends), dropping what is
        in flight; returns how many. New connections are accepted as before."""
        conns = list(self._conns)
        for conn in conns:
            conn.abort()
        return len(conns)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        conn = _Conn([writer])
        self._conns.add(conn)
        try:
            # While the link is down a new connection reaches nothing: held, not refused.
            if not await self._until_up(conn):
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()
                return
            conn.writers.append(up_writer)
            if conn.dead.is_set():  # reset while connecting
                conn.abort()
                return
            links = (self.spec.build(self.seed + next(self._conn_ids), self.outage_schedule)
                     if self.spec else (None, None))
            conn.pumps = [asyncio.create_task(self._pump(reader, up_writer, "up", links[0], conn)),
                          asyncio.create_task(self._pump(up_reader, writer, "down", links[1],
                                                         conn))]
            conn.tasks.update(conn.pumps)
            await asyncio.gather(*conn.pumps, return_exceptions=True)
        except asyncio.CancelledError:  # the proxy stops: asyncio's stream callback would
            for t in conn.pumps:        # log a cancelled connection handler as an error
                t.cancel()
        finally:
            self._conns.discard(conn)

    async def _until_up(self, conn: _Conn) -> bool:
        """Wait until the link is up; False if the connection died meanwhile."""
        while (wait := self.outage_schedule.back_at(self.now()) - self.now()) > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(conn.dead.wait(), wait)
            if conn.dead.is_set():
                conn.writers[0].close()
                return False
        return not conn.dead.is_set()

    async def _pump(self, src, dst, direction: str, link: Link | None, conn: _Conn):
        queue: asyncio.Queue = asyncio.Queue()  # (due s, bytes), then None
        writer = asyncio.create_task(self._deliver(queue, dst))
        conn.tasks.add(writer)
        try:
            while data := await src.read(65536):
                setattr(self.counts, direction, getattr(self.counts, direction) + len(data))
                now = self.now()
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
        try:
            while (item := await queue.get()) is not None:
                due, piece = item
                # Not before its time, nor while the link is down: a cut made after the piece
                # was scheduled holds it too.
                while (wait := max(due, self.outage_schedule.back_at(self.now()))
                        - self.now()) > 0:
                    await asyncio.sleep(wait)
                dst.write(piece)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()

    async def stop(self) -> None:
        """Stop listening and end every connection; what is in flight is still delivered."""
        if self._server:
            self._server.close()
        for conn in list(self._conns):
            conn.dead.set()  # connections held by an outage give up
            for t in conn.pumps:
                t.cancel()
        if self._server:
            await self._server.wait_closed()


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

    @property
    def outage_schedule(self) -> OutageSchedule:
        return self.proxy.outage_schedule

    async def start(self) -> int:
        """Start the thread and the proxy in it; returns the bound port."""
        self._thread.start()
        return await self._call(self.proxy.start())

    async def cut(self, seconds: float) -> None:
        """LinkProxy.cut, on the proxy's loop."""
        await self._call(_sync(self.proxy.cut, seconds))

    async def reset(self) -> int:
        """LinkProxy.reset, on the proxy's loop."""
        return await self._call(_sync(self.proxy.reset))

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


async def _sync(fn, *args):
    return fn(*args)


class CountingProxy(LinkProxy):
    """A pass-through proxy that only counts bytes each way."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0):
        super().__init__(target_host, target_port, listen_host, listen_port, spec=None)
