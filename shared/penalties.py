"""Repetition penalties: what OpenAI's presence and frequency penalties and vLLM's (and
Hugging Face's) repetition penalty do to the logits before sampling (docs/design.md §5).

Both sides apply the same function to the same text: the verifier to the target's logits
(the served distribution is then the penalised one, so output stays lossless with respect to
the penalised target) and the drafter to its own (so its drafts follow the same rule and are
accepted as often as without). The state is the text so far; `output_from`
(SamplingParams) is the position where the request's output starts, so a session re-opened
with the committed output in its prompt still counts that output as output. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from acespec.shared.config import Penalties


def penalise(logits: np.ndarray, text: Sequence[int], p: Penalties,
             output_from: int = 0) -> np.ndarray:
    """[V] logits -> [V] float64 penalised logits for the token after `text` (every token so
    far: prompt, then output from position output_from). The logits are returned as they
    are (as float64) when no penalty is on."""
    x = np.array(logits, dtype=np.float64)
    if not p.on or not len(text):
        return x
    ids = np.asarray(text, dtype=np.int64)
    if p.repetition != 1:  # (in [1/10, 10]: finite logits stay finite)
        seen = np.unique(ids)
        x[seen] = np.where(x[seen] > 0, x[seen] / p.repetition, x[seen] * p.repetition)
    out = ids[output_from:]
    if len(out) and (p.presence or p.frequency):
        tokens, counts = np.unique(out, return_counts=True)
        x[tokens] -= p.frequency * counts + p.presence
    return x
