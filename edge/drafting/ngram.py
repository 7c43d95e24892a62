"""Prompt-lookup drafting: continue with what followed the last occurrence of the context's
final n-gram. Needs no model; its q is a point mass on each proposal."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from acespec.edge.drafting.base import Draft
from acespec.shared.config import SamplingParams
from acespec.shared.lookup import lookup


class NgramDrafter:
    """Prompt-lookup drafter (as in vLLM's NgramProposer): tries n-grams from max_n down to
    min_n; with no match it repeats the last token, so it always drafts n tokens."""

    def __init__(self, vocab_size: int, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.vocab_size, self.min_n, self.max_n = vocab_size, min_n, max_n

    def draft(self, context: Sequence[int], n: int, sampling: SamplingParams,
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
        return lookup(ctx, n, self.min_n, self.max_n, window=len(ctx)) or [ctx[-1]]
