"""What the text so far does to the logits before p~ and q are taken: the request's penalties
(acespec.shared.penalties), then its grammar's mask (acespec.shared.grammar). One function,
so the verifier's target and the edge's drafter are shaped alike from the same text."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from acespec.shared.config import SamplingParams
from acespec.shared.grammar import Cursor
from acespec.shared.penalties import penalise


def shape(logits: np.ndarray, text: Sequence[int], sampling: SamplingParams,
          grammar: Cursor | None = None) -> np.ndarray:
    """[V] logits for the token after `text` (prompt + output): penalised, then with what
    `grammar` forbids at -inf; as they are when nothing shapes them."""
    if sampling.penalties.on:
        logits = penalise(logits, text, sampling.penalties, sampling.output_from)
    if grammar is not None:
        logits = grammar.apply(logits, text)
    return logits
