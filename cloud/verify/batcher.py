"""Runs the target for many sessions: pending requests are scored together in one forward
pass (continuous batching at request granularity), one pass at a time, in a worker thread
so the event loop keeps serving streams."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from acespec.cloud.errors import Unavailable
from acespec.cloud.target.model import Request, Transformer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepEmulation:
    """Testbed knob: add a big model's step time to every forward pass."""

    base_ms: float = 0.0  # per pass
    per_node_ms: float = 0.0  # per scored node

    @classmethod
    def parse(cls, text: str | None) -> StepEmulation:
        """'T0' or 'T0,PER_NODE' in milliseconds."""
        if not text:
            return cls()
        parts = [float(x) for x in text.split(",")]
        if len(parts) > 2 or any(x < 0 for x in parts):
            raise ValueError(f"--emulate-step-ms wants T0[,PER_NODE] >= 0, got {text!r}")
        return cls(parts[0], parts[1] if len(parts) > 1 else 0.0)

    def seconds(self, n_nodes: int) -> float:
        return (self.base_ms + self.per_node_ms * n_nodes) / 1000


@dataclass
class PassStats:
    sessions: int
    nodes: int
    seconds: float


class Batcher:
    def __init__(self, model: Transformer, max_batch_nodes: int = 1024,
                 emulation: StepEmulation = StepEmulation(), on_pass=None):
        self.model, self.max_batch_nodes, self.emulation = model, max_batch_nodes, emulation
        self.on_pass = on_pass  # callback(PassStats) for metrics
        self._queue: asyncio.Queue[tuple[Request, asyncio.Future]] = asyncio.Queue()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="target")
        self._task: asyncio.Task | None = None
        self.passes = 0
        self.requests_scored = 0

    async def score(self, req: Request) -> torch.Tensor:
        """Logits for one request, scored in the next pass."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._worker())
        fut = asyncio.get_running_loop().create_future()
        await self._queue.put((req, fut))
        return await fut

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if batch:
                nodes = sum(len(r.tokens) for r, _ in batch)
                await loop.run_in_executor(self._pool, self._run, batch, nodes)
            # Drop the requests now, not when the next one arrives: each holds its KV cache,
            # whose blocks go back to the pool (which may then shrink) only once unreferenced.
            batch = None

    async def _next_batch(self) -> list[tuple[Request, asyncio.Future]]:
        """The queued requests, up to max_batch_nodes, less those whose caller gave up."""
        batch = [await self._queue.get()]
        nodes = len(batch[0][0].tokens)
        while not self._queue.empty() and nodes < self.max_batch_nodes:
            item = self._queue.get_nowait()
            batch.append(item)
            nodes += len(item[0].tokens)
        return [(r, f) for r, f in batch if not f.cancelled()]

    def _run(self, batch, nodes: int) -> None:
        t0 = time.perf_counter()
        try:
            results = self.model.forward_batch([r for r, _ in batch])
        except Unavailable as e:  # no pass can run (a lost rank): every request fails alike
            results = [e] * len(batch)
        except Exception:  # one bad request must not fail the others: retry one by one
            log.exception("batched forward failed; retrying %d requests separately", len(batch))
            results = []
            for r, _ in batch:
                try:
                    results.append(self.model.forward_batch([r])[0])
                except Exception as e:  # noqa: BLE001 - delivered to that request only
                    results.append(e)
        delay = self.emulation.seconds(nodes)
        if delay:  # on top of the real compute, as a big model's step would be
            time.sleep(delay)
        self.passes += 1
        self.requests_scored += len(batch)
        stats = PassStats(len(batch), nodes, time.perf_counter() - t0)
        for (_, fut), res in zip(batch, results):
            fut.get_loop().call_soon_threadsafe(_resolve, fut, res)
        if self.on_pass:
            self.on_pass(stats)

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _resolve(fut: asyncio.Future, result) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
