"""The drafter interface: one obvious method, `draft`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from acespec.shared.config import SamplingParams
from acespec.shared.sampling import sample


@dataclass(frozen=True)
class Draft:
    """Tokens a drafter drafts after a context, with the distribution each was drawn from."""

    tokens: np.ndarray  # [n] int32 draft token ids
    q: np.ndarray  # [n, V] float64 draft distributions (after the request's sampling transform)
    ranks: np.ndarray | None = None  # [n, V] float64 the drafter's plain softmax (T = 1): how
    # likely the alternatives are, even when q is one-hot (greedy); the speculation tree ranks
    # its guesses by it

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    vocab_size: int

    def draft(self, context: Sequence[int], n: int, sampling: SamplingParams,
                rng: np.random.Generator, seq: int = 0) -> Draft:
        """Draft n tokens continuing `context` (all token ids so far) in sequence slot `seq`.
        Each token is drawn from q with `rng` (argmax when greedy)."""
        ...


def draw(q: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> int:
    """A draft token from one [V] distribution: argmax when greedy, the coupled draw (rng must
    be a PositionalRng: the noise is keyed by position) when coupled, else a draw with rng."""
    if sampling.greedy:
        return int(q.argmax())
    if sampling.coupled:
        return rng.coupled(q)
    return sample(q, rng)
