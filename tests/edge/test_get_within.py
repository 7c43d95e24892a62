"""driver.get_within: the drivers' wait for the downlink. A cancellation (Ctrl-C in `acespec
demo`, a client gone in `edge serve`) that lands as an item arrives must propagate; Python
3.11's asyncio.wait_for swallowed it there (`acespec demo` then ran on after Ctrl-C and exited
0: seen once in CI)."""

import asyncio

import pytest

from acespec.edge.session.driver import get_within


def test_an_item_or_a_timeout():
    async def main():
        q: asyncio.Queue = asyncio.Queue()
        q.put_nowait("x")
        assert await get_within(q, 1.0) == "x"
        with pytest.raises(asyncio.TimeoutError):
            await get_within(q, 0.01)
        assert q.empty()

    asyncio.run(main())


async def _cancel_as_the_item_arrives(wait) -> tuple[bool, int]:
    """(whether the waiting task ended cancelled, items left in the queue) when an item is
    put and the task cancelled in the same loop iteration."""
    q: asyncio.Queue = asyncio.Queue()

    async def loop():
        while True:
            await wait(q)

    task = asyncio.ensure_future(loop())
    await asyncio.sleep(0.01)  # the task now waits on the queue
    q.put_nowait("item")
    task.cancel()
    try:
        await asyncio.wait_for(asyncio.shield(task), 0.5)
    except asyncio.CancelledError:
        return True, q.qsize()
    except asyncio.TimeoutError:
        task.cancel()
        return False, q.qsize()  # the cancellation was lost: the loop went on waiting
    return False, q.qsize()


def test_a_cancellation_racing_an_item_propagates():
    cancelled, _ = asyncio.run(_cancel_as_the_item_arrives(lambda q: get_within(q, 5.0)))
    assert cancelled


def test_the_race_is_real_with_wait_for():
    """The mutant: 3.10/3.11's wait_for returns the item and loses the cancellation (3.12+
    fixed it, so there the race is not shown)."""
    import sys

    if sys.version_info >= (3, 12):
        pytest.skip("wait_for no longer swallows a racing cancellation on 3.12+")
    cancelled, _ = asyncio.run(_cancel_as_the_item_arrives(
        lambda q: asyncio.wait_for(q.get(), 5.0)))
    assert not cancelled
