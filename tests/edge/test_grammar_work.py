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


def structure(n_properties: int, prefix: str = "p", required: bool = False):
    """An object schema of n string properties: optional (past about 500, too complex for
    llguidance to follow), or all required (a sequence: cheap to follow)."""
    names = [f"{prefix}{i}" for i in range(n_properties)]
    schema = {"type": "object", "properties": {n: {"type": "string"} for n in names}}
    if required:
        schema |= {"required": names, "additionalProperties": False}
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
        assert gap < 0.6  # the loop ran all along (a build on it: one gap of the build's time)
        assert isinstance(refused, ApiError) and refused.status == 400, refused
        assert refused.param == "response_format" and refused.code == "grammar_too_costly"
        assert "0.3 s" in refused.message and f"{big.size} characters" in refused.message
        t0 = time.perf_counter()
        with pytest.raises(ApiError, match="grammar"):
            await work.compile(big)  # asked again: the kept refusal, at once (compiled
        assert time.perf_counter() - t0 < 0.25  # again, it would wait for the first build)
    asyncio.run(main())


def test_compiles_past_the_waiting_line_are_503():
    async def main():
        work = GrammarWork(CompileLimits(seconds=5.0, at_once=1, waiting=1))
        first = asyncio.ensure_future(work.compile(structure(2000, "a")))
        await asyncio.sleep(0.01)  # it runs (~0.4 s); the next waits its turn
        second = asyncio.ensure_future(work.compile(structure(2000, "b")))
        await asyncio.sleep(0.01)
        with pytest.raises(ApiError) as e:
            await work.compile(structure(2000, "c"))
        assert e.value.status == 503 and e.value.headers == {"Retry-After": "1"}
        for done in await asyncio.gather(first, second, return_exceptions=True):
            assert isinstance(done, ApiError) and done.status == 400, done  # too complex
    asyncio.run(main())


def test_an_object_too_complex_to_follow_is_refused_naming_the_schema():
    """600 optional properties: llguidance gives up after "{" (a mask it cannot compute
    would leave the answer unconstrained); 3,000 required ones are served."""
    async def main():
        work = GrammarWork()
        with pytest.raises(ApiError) as e:
            await work.compile(structure(600))
        assert e.value.param == "response_format.json_schema.schema"
        assert "too complex to follow" in e.value.message and e.value.code == "invalid_schema"
        assert '"p2999"' in await work.compile(structure(3000, required=True))
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


def test_the_drafters_matcher_is_built_without_its_lock(tiny_pair):
    """With a llama.cpp drafter, the lexer is built over its vocabulary in the compiler's
    worker: another request's drafting goes on meanwhile (it would wait on the drafter's
    lock for the whole build), and the first draft in the grammar copies the prepared
    matcher (in much less time than the build) and drafts within it. Two builds of two
    schemas, the collector off: one stall of the drafting thread (the machine's) can fill
    one build, not both; a build under the lock fills every one."""
    pytest.importorskip("llama_cpp")
    import gc

    import numpy as np

    from acespec.edge.drafting.llama import LlamaDrafter
    from acespec.shared.config import SamplingParams
    from acespec.shared.grammar import Cursor

    drafter = LlamaDrafter(tiny_pair[2]["q8_0"])
    builds = [_build_while_drafting(drafter, prefix) for prefix in ("p", "q")]
    try:
        assert all(drafter.is_prepared(g) and b > 0.2 for g, b, _ in builds), builds
        assert min(gap / b for _, b, gap in builds) < 1 / 2, builds
        firsts = []  # (seconds, draft): each grammar's first draft
        gc.disable()
        try:
            for seq, (grammar, _, _) in enumerate(builds, start=2):
                t0 = time.perf_counter()
                draft = drafter.draft([1, 2], 6, SamplingParams(grammar=grammar, output_from=2),
                                      np.random.default_rng(0), seq=seq)
                firsts.append((time.perf_counter() - t0, draft))
        finally:
            gc.enable()
        assert min(t / b for (t, _), (_, b, _) in zip(firsts, builds)) < 1 / 2, firsts
        for (grammar, _, _), (_, draft) in zip(builds, firsts):  # every draft in its grammar
            cursor = Cursor(drafter.grammar_tokenizer(), grammar, 2, drafter.vocab_size)
            text = [1, 2]
            for token in draft.tokens:
                assert cursor.mask(text)[token]
                text.append(int(token))
    finally:
        drafter.close()


def _build_while_drafting(drafter, prefix: str) -> tuple[str, float, float]:
    """(the grammar of a 6,000-property schema compiled for `drafter`, seconds the compile
    took, the longest another thread's drafting went without a draft meanwhile)."""
    import gc
    import threading

    import numpy as np

    from acespec.shared.config import SamplingParams

    stop, gaps = threading.Event(), []

    def other_request():
        last = time.perf_counter()
        while not stop.is_set():
            drafter.draft([1, 2, 3], 2, SamplingParams(), np.random.default_rng(0), seq=1)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def main():
        return await GrammarWork().compile(structure(6000, prefix, required=True), drafter)
    t = threading.Thread(target=other_request)
    gc.disable()
    t.start()
    try:
        t0 = time.perf_counter()
        grammar = asyncio.run(main())
        built = time.perf_counter() - t0
    finally:
        stop.set()
        t.join()
        gc.enable()
    return grammar, built, max(gaps)
