"""A session's write of the last pass's result waits for the next pass to start (so it is
no part of the turnaround between passes), begins at once when the session needs it
first, raises the write's error where it is awaited, and is never made once cancelled."""

from __future__ import annotations

import asyncio
import gc

import pytest

from acespec.cloud.serving.deferred import WriteAtStart


def run(coro):
    return asyncio.run(coro)


async def _ticks(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_write_begins_when_the_pass_starts():
    async def go():
        start, written = asyncio.get_running_loop().create_future(), []

        async def write(msg):
            written.append(msg)

        w = WriteAtStart(start, write, "decided")
        await _ticks()
        before = list(written)
        start.set_result(None)
        await _ticks()
        after = list(written)
        await w.finish()  # already written: finishing writes nothing more
        return before, after, written

    before, after, written = run(go())
    assert before == [] and after == ["decided"] and written == ["decided"]


def test_finish_writes_at_once_when_no_pass_started():
    async def go():
        start, written = asyncio.get_running_loop().create_future(), []

        async def write(msg):
            written.append(msg)

        await WriteAtStart(start, write, "decided").finish()
        start.set_result(None)  # a pass starting later writes it no second time
        await _ticks()
        return written

    assert run(go()) == ["decided"]


def test_a_failed_write_raises_where_it_is_finished():
    async def go():
        start = asyncio.get_running_loop().create_future()

        async def write(msg):
            raise ConnectionError("the client went away")

        w = WriteAtStart(start, write, "decided")
        start.set_result(None)
        await _ticks()
        await w.finish()

    with pytest.raises(ConnectionError, match="went away"):
        run(go())


def test_a_cancelled_write_is_never_made():
    async def go():
        loop = asyncio.get_running_loop()
        start, written, errors = loop.create_future(), [], []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

        async def write(msg):
            written.append(msg)

        async def failing(msg):
            raise ConnectionError("gone")

        WriteAtStart(start, write, "before the pass").cancel()
        started = asyncio.get_running_loop().create_future()
        failed = WriteAtStart(started, failing, "during the pass")
        started.set_result(None)
        await _ticks()
        failed.cancel()  # its error is dropped, not logged as never retrieved
        start.set_result(None)
        await _ticks()
        del failed
        gc.collect()  # an unretrieved error is logged when its task is collected
        return written, errors

    written, errors = run(go())
    assert written == [] and errors == []
