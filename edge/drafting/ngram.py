"""Prompt-lookup drafting: continue with what followed the last occurrence of the context's
final n-gram. Needs no model; its q is a point mass on each proposal."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from acespec.edge.drafting.base import Draft
from acespec.shared.config import SamplingParams


class NgramDrafter:
    """Prompt-lookup drafter (as in vLLM's NgramProposer): tries n-grams from max_n down to
    min_n; with no match it repeats the last token, so it always proposes n tokens."""

    def __init__(self, vocab_size: int, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.vocab_size, self.min_n, self.max_n = vocab_size, min_n, max_n

    def propose(self, context: Sequence[int], n: int, sampling: SamplingParams,
                rng: np.random.Generator, seq: int = 0) -> Draft:
        ctx = list(context)
        if not ctx:
            raise ValueError("the n-gram drafter needs a non-empty context")
        tokens: list[int] = []
        while len(tokens) < n:
            tokens.extend(self._lookup(ctx + tokens, n - len(tokens)))
        q = np.zeros((n, self.vocab_size))
        q[np.arange(n), tokens[:n]] = 1.0
        return Draft(tokens=np.asarray(tokens[:n], dtype=np.int32), q=q)

    def _lookup(self, ctx: list[int], n: int) -> list[int]:
        arr = np.asarray(ctx)
        for size in range(min(self.max_n, len(ctx) - 1), self.min_n - 1, -1):
            tail = arr[-size:]
            # Latest earlier start i with arr[i:i+size] == tail and something after it.
            for i in range(len(ctx) - size - 1, -1, -1):
                if np.array_equal(arr[i:i + size], tail):
                    return ctx[i + size:i + size + n]
        return [ctx[-1]]
