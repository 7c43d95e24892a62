"""A message written once the device's next pass has started.

A session's next request must reach the batcher before the next pass starts, or it waits a
whole pass; its write of what the last pass gave it need not. Written during the pass, the
write is not part of the verifier's turnaround between passes (the device's idle time,
acespec_turnaround_seconds_total)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class WriteAtStart:
    """write(msg), begun when `start` resolves (a callback: no task waits for it meanwhile)
    or when finish() is awaited first."""

    def __init__(self, start: asyncio.Future, write: Callable[[object], Awaitable[None]],
                 msg: object):
        self._write, self._msg = write, msg
        self._task: asyncio.Task | None = None
        self._cancelled = False
        start.add_done_callback(self._begin)

    def _begin(self, _start: asyncio.Future | None = None) -> None:
        if self._task is None and not self._cancelled:
            self._task = asyncio.get_running_loop().create_task(self._write(self._msg))

    async def finish(self) -> None:
        """The write, begun now if it was not; its error is raised here."""
        self._begin()
        await self._task

    def cancel(self) -> None:
        """Not written, or its write cancelled; an error it met is dropped (cancelling a
        finished task marks its error retrieved)."""
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()
