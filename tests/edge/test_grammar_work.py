"""The edge's grammar compiler (acespec.edge.api.grammar_work) on real llguidance compiles:
the event loop keeps running while a schema compiles, a compile past the time bound is a 400
naming the field, the bound and the size (and asked again, refused at once), a line of
waiting compiles past its bound is a 503, and a schema that generates nothing is refused."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("llguidance")

from acespec.edge.api.errors import ApiError  # noqa: E402
from acespec.edge.api.grammar_work import CompileLimits, GrammarWork  # noqa: E402
from acespec.edge.api.structured import response_structure  # noqa: E402


def structure(n_properties: int, prefix: str = "p"):
    schema = {"type": "object", "properties": {f"{prefix}{i}": {"type": "string"}
                                               for i in range(n_properties)}}
    return response_structure({"type": "json_schema", "json_schema": {"schema": schema}})


async def ticking(work) -> tuple[object, float]:
    """(work's outcome, the longest the loop went without running a 10 ms ticker)."""
    gaps, last = [], time.perf_counter()

    async def ticker():
        nonlocal last
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    tick = asyncio.ensure_future(ticker())
    try:
        outcome = await asyncio.gather(work, return_exceptions=True)
    finally:
        tick.cancel()
    return outcome[0], max(gaps)


def test_a_compile_runs_off_the_loop_and_a_slow_one_is_refused_by_name():
    async def main():
        work = GrammarWork(CompileLimits(seconds=0.3))
        grammar, gap = await ticking(work.compile(structure(300)))
        assert isinstance(grammar, str) and '"p299"' in grammar and gap < 0.25
        big = structure(4000)  # ~1.5 s to build its lexer here
        refused, gap = await ticking(work.compile(big))
        assert gap < 0.25  # the loop ran all along
        assert isinstance(refused, ApiError) and refused.status == 400, refused
        assert refused.param == "response_format" and refused.code == "grammar_too_costly"
        assert "0.3 s" in refused.message and f"{big.size} characters" in refused.message
        t0 = time.perf_counter()
        with pytest.raises(ApiError, match="grammar"):
            await work.compile(big)  # asked again: the kept refusal, at once
        assert time.perf_counter() - t0 < 0.05
    asyncio.run(main())


def test_compiles_past_the_waiting_line_are_503():
    async def main():
        work = GrammarWork(CompileLimits(seconds=5.0, at_once=1, waiting=1))
        first = asyncio.ensure_future(work.compile(structure(1500, "a")))
        await asyncio.sleep(0.01)  # it runs; the next waits its turn
        second = asyncio.ensure_future(work.compile(structure(1500, "b")))
        await asyncio.sleep(0.01)
        with pytest.raises(ApiError) as e:
            await work.compile(structure(1500, "c"))
        assert e.value.status == 503 and e.value.headers == {"Retry-After": "1"}
        assert all(isinstance(g, str) for g in await asyncio.gather(first, second))
    asyncio.run(main())


def test_a_schema_that_generates_nothing_is_refused_naming_it():
    async def main():
        cycle = response_structure({"type": "json_schema", "json_schema": {
            "schema": {"$ref": "#"}}})
        with pytest.raises(ApiError) as e:
            await GrammarWork().compile(cycle)
        assert e.value.param == "response_format.json_schema.schema"
        assert "generates no text" in e.value.message
    asyncio.run(main())
