"""The interface of a session driver, and the downlink plumbing every streaming driver uses.

A driver runs one connection attempt of one request in one wire protocol:

* ar            (acespec.edge.session.ar)            `Generate`: the verifier decodes alone.
* edge-decided  (acespec.edge.session.edge_decided)  `Extend`/`Scores`: the edge walks the
  scored tree.
* grow          (acespec.edge.session.grow)          `Grow`/`Decided`: the verifier decides;
  the edge streams a tree (a chain where the mode has no branches).
* no draft      (acespec.edge.session.no_draft)      `Decided`: the verifier decides and
  speculates alone.

It reads and writes the request's state only through the Runner's public surface
(acespec.edge.session.runner), returns when the request is finished, and raises when the
connection is lost (Lost, ConnectionError, a gRPC error); the engine then reconnects and a
new driver resumes from the committed text.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

import grpc

from acespec.edge.client import CloudSession


class Lost(ConnectionError):
    """The verifier connection failed mid-session; the engine reconnects."""


class Driver(Protocol):
    async def drive(self) -> None:
        """Decode until the runner is finished; raise if the connection is lost."""


async def read_downlink(sess: CloudSession, inbox: asyncio.Queue) -> None:
    """Hand every downlink message to the driver as (message, bytes, server seconds, arrival
    time); the reader's error, last, as the exception itself."""
    try:
        while True:
            before = sess.bytes_down
            msg = await sess.recv()
            await inbox.put((msg, sess.bytes_down - before, sess.server_s, time.perf_counter()))
    except Exception as e:  # noqa: BLE001 - handed to the driver, which reconnects
        await inbox.put(e)


async def get_within(inbox: asyncio.Queue, timeout: float):
    """The next inbox item, or asyncio.TimeoutError after `timeout` s. Unlike
    asyncio.wait_for on Python 3.10/3.11, a cancellation (Ctrl-C, a client gone) that lands as
    the item arrives is never swallowed: it propagates (the session is ending; the item is
    dropped with it)."""
    get = asyncio.ensure_future(inbox.get())
    try:
        done, _ = await asyncio.wait({get}, timeout=timeout)
    finally:
        if not get.done():
            get.cancel()
    if get not in done:
        raise asyncio.TimeoutError
    return get.result()


def unpack(item) -> tuple[object, int, float, float]:
    """(message, bytes, server seconds, arrival time) of one inbox item, or raise what the
    reader met: a refusal from the verifier as it is (the caller decides, no blind retry),
    anything else as Lost."""
    msg, size, server_s, arrived = item if isinstance(item, tuple) else (item, 0, 0.0, 0.0)
    if isinstance(msg, grpc.aio.AioRpcError) and msg.code() != grpc.StatusCode.UNAVAILABLE:
        raise msg
    if isinstance(msg, Exception):
        raise Lost(str(msg)) from msg
    return msg, size, server_s, arrived
