"""Compiling requests' grammars off the event loop, within a time bound.

A request's structure (edge.api.structured) is checked for size as it is parsed; compiling
it (llguidance: the schema's grammar, then its lexer, to learn that it generates anything)
takes from milliseconds to seconds, and runs here: in worker threads (llguidance drops the
GIL while it builds), `at_once` at a time, so a flood of big schemas queues instead of taking
every core from the drafter (past `waiting` in line, a request gets 503 with Retry-After, as
generations queued past --max-queue do). A compile that runs past `seconds` is refused with
a 400 naming the field, the limit and the schema's size; its thread finishes in the
background (the size check bounds how long) and keeps its slot until then. Outcomes,
refusals included, are kept by the schema's text, so a client that sends one schema with
every request compiles it once.

With a drafter that drafts within grammars (LlamaDrafter), the lexer is built over the
drafter's vocabulary here, and the drafter keeps the matcher (prepare_grammar): its first
draft in the grammar copies it instead of building it under the drafter's lock, where every
other request's drafting would wait.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from acespec.edge.api.errors import ApiError
from acespec.edge.api.structured import Structure
from acespec.shared.grammar import new_matcher


@dataclass(frozen=True)
class CompileLimits:
    seconds: float = 2.0  # wall time one compile may take, once it runs
    at_once: int = 1  # compiles running together (the rest wait their turn)
    waiting: int = 16  # compiles waiting their turn; more get 503 with Retry-After
    kept: int = 64  # outcomes kept by schema text


class GrammarDrafter(Protocol):
    """A drafter that drafts within grammars, and keeps their matchers built ahead."""

    def grammar_tokenizer(self) -> object: ...

    def prepare_grammar(self, grammar: str, matcher: object) -> None: ...

    def is_prepared(self, grammar: str) -> bool: ...


class GrammarWork:
    """The edge server's grammar compiler: `await compile(structure)` -> grammar text."""

    def __init__(self, limits: CompileLimits = CompileLimits()):
        self.limits = limits
        self._pool = ThreadPoolExecutor(limits.at_once, thread_name_prefix="grammar")
        self._slots: asyncio.Semaphore | None = None  # made in the server's loop
        self._kept: OrderedDict[tuple[str, str], str | ApiError] = OrderedDict()
        self._waiting = 0

    async def compile(self, structure: Structure, drafter: GrammarDrafter | None = None) -> str:
        """The structure's grammar (its matcher prepared in `drafter`); ApiError 400 naming
        the field when it cannot be compiled, generates nothing, or takes longer than the
        limit."""
        key = (structure.param, structure.text)
        outcome = self._kept.get(key)
        if outcome is None:
            outcome = await self._run(lambda: _outcome(structure, drafter), structure)
            self._keep(key, outcome)
        else:
            self._kept.move_to_end(key)
            if isinstance(outcome, str) and drafter is not None and \
                    not drafter.is_prepared(outcome):  # kept here, no longer there
                await self._run(lambda: _prepare(outcome, drafter), structure)
        if isinstance(outcome, ApiError):
            raise outcome
        return outcome

    async def _run(self, work: Callable[[], str | ApiError],
                   structure: Structure) -> str | ApiError:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limits.at_once)
        if self._slots.locked() and self._waiting >= self.limits.waiting:
            raise ApiError(503, f"the server is busy compiling grammars ({self._waiting} "
                           "waiting); retry shortly", kind="server_error", code="server_busy",
                           headers={"Retry-After": "1"})
        self._waiting += 1
        try:
            await self._slots.acquire()  # the wait for a turn does not count against the limit
        finally:
            self._waiting -= 1
        t0 = time.perf_counter()
        done = asyncio.get_running_loop().run_in_executor(self._pool, work)
        done.add_done_callback(lambda _: self._slots.release())
        try:
            return await asyncio.wait_for(asyncio.shield(done), self.limits.seconds)
        except asyncio.TimeoutError:
            return ApiError(400, f"'{structure.param}': compiling its grammar ran past "
                            f"{self.limits.seconds:g} s (this server's limit) at "
                            f"{time.perf_counter() - t0:.1f} s; its JSON schema is "
                            f"{structure.size} characters: send a smaller one",
                            structure.param, code="grammar_too_costly")

    def _keep(self, key: tuple[str, str], outcome: str | ApiError) -> None:
        self._kept[key] = outcome
        while len(self._kept) > self.limits.kept:
            self._kept.popitem(last=False)


def _outcome(structure: Structure, drafter: GrammarDrafter | None) -> str | ApiError:
    """The grammar (its matcher prepared in the drafter), or the refusal (kept alike)."""
    try:
        tokenizer = drafter.grammar_tokenizer() if drafter is not None else None
        grammar, matcher = structure.compile(tokenizer)
    except ApiError as e:
        return e
    if drafter is not None:
        drafter.prepare_grammar(grammar, matcher)
    return grammar


def _prepare(grammar: str, drafter: GrammarDrafter) -> str:
    drafter.prepare_grammar(grammar, new_matcher(drafter.grammar_tokenizer(), grammar))
    return grammar
