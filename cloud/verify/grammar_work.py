"""Structured output's work off the verifier's event loop and pass loop (docs/design.md §5).

Building a grammar's matcher (its lexer: seconds for a large schema) and masking the logits
with it after each pass run in threads of their own (llguidance releases the GIL), so one
large schema never stalls the event loop that serves every other session's stream, nor the
worker that runs the passes. What a session's grammar costs there counts against its share
(acespec.cloud.verify.share): its seconds, as the nodes a pass would score in that time,
are charged as speculative nodes that gave nothing.

A build that runs past BUILD_S is refused (INVALID_ARGUMENT naming sampling.grammar, the
limit and the grammar's size; the edge's API bounds its own compile sooner, so only a client
that bypasses it meets this); its thread finishes in the background. Built matchers are kept
by grammar text (KEPT of them), so sessions that share a schema build it once and copy it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from acespec.cloud.errors import FailedPrecondition, InvalidArgument
from acespec.shared.grammar import Cursor, GrammarError, new_matcher, tokenizer_from_json
from acespec.shared.served import ServeParams

T = TypeVar("T")
WORKERS = 2  # grammar threads: a large schema's build does not hold up every other's mask
BUILD_S = 10.0  # the most seconds a grammar's matcher may take to build
KEPT = 16  # built matchers kept by grammar text


class GrammarWork:
    """The threads where sessions' grammars are built and applied."""

    def __init__(self, tokenizer: tuple[str, int | None] | None, vocab: int):
        self.tokenizer, self.vocab = tokenizer, vocab
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="grammar")
        self._kept: OrderedDict[str, object] = OrderedDict()  # grammar -> pristine matcher

    async def cursor(self, params: ServeParams) -> Cursor | None:
        """The session's grammar, following its output (None: free text), built off the
        loop; InvalidArgument naming what is wrong when it cannot be used."""
        grammar = params.sampling.grammar
        if grammar is None:
            return None
        if self.tokenizer is None:
            raise FailedPrecondition("this verifier has no tokenizer.json for structured "
                                     "output's grammars")
        pristine = self._kept.pop(grammar, None)
        if pristine is None:
            pristine = await self._build(grammar)
        self._kept[grammar] = pristine  # the newest last: the oldest go first
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)
        return Cursor(tokenizer_from_json(*self.tokenizer), grammar,
                      params.sampling.output_from, self.vocab, pristine)

    async def _build(self, grammar: str):
        """The grammar's matcher at the start of text, built in a grammar thread within
        BUILD_S."""
        built = asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: new_matcher(tokenizer_from_json(*self.tokenizer), grammar))
        try:
            return await asyncio.wait_for(asyncio.shield(built), BUILD_S)
        except GrammarError as e:
            raise InvalidArgument(f"sampling.grammar: {e}") from None
        except TimeoutError:
            built.add_done_callback(lambda f: f.exception())  # its outcome is not wanted
            raise InvalidArgument(f"sampling.grammar: its matcher took more than {BUILD_S:g} "
                                  f"s to build ({len(grammar)} characters of grammar); send a "
                                  "smaller schema") from None

    async def apply(self, grammar: Cursor | None, fn: Callable[..., T], *args
                    ) -> tuple[T, float]:
        """fn(*args) (a session's decisions from a pass's logits), off the loop when the
        session has a grammar to mask them with: (its result, the seconds it took there;
        0.0 without a grammar, run here at once)."""
        if grammar is None:
            return fn(*args), 0.0
        t0 = time.perf_counter()
        out = await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        return out, time.perf_counter() - t0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
