"""Prompt lookup: continue a text with what followed the latest earlier occurrence of its
final n-gram (as vLLM's n-gram proposer and "prompt lookup decoding" do). The edge's n-gram
drafter and the verifier's own proposals for passes no draft covers both use it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def lookup(tokens: Sequence[int] | np.ndarray, k: int, min_n: int = 1, max_n: int = 4,
           window: int = 4096) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the text's last n
    tokens, for the largest n in [min_n, max_n] that occurs (only the last `window` tokens
    are searched); [] when none does. tokens: [L] int."""
    return lookup_order(tokens, k, min_n, max_n, window)[0]


def lookup_order(tokens: Sequence[int] | np.ndarray, k: int, min_n: int = 1, max_n: int = 4,
                 window: int = 4096) -> tuple[list[int], int]:
    """`lookup`'s tokens and the n of the n-gram they follow (0 when none occurs): a longer
    match is likelier to go on."""
    arr = np.asarray(tokens[-window:], dtype=np.int64)  # slice first: a session's list is long
    last = len(arr) - 1
    n_max = min(max_n, last)
    if n_max < max(min_n, 1):
        return [], 0
    # Ends e (< last) of earlier occurrences of the final token, then how far back each goes
    # on matching the text's tail: one pass over the text, then only over those candidates.
    ends = np.flatnonzero(arr[:-1] == arr[-1])
    length = np.ones(len(ends), np.int64)  # matched tail tokens at each end, up to n_max
    alive = np.ones(len(ends), bool)
    for j in range(1, n_max):
        alive &= ends >= j
        alive[alive] = arr[ends[alive] - j] == arr[last - j]
        length += alive
    for n in range(n_max, min_n - 1, -1):
        hits = ends[length >= n]
        if len(hits):
            start = int(hits[-1]) + 1  # the latest occurrence: what followed it
            return arr[start:start + k].tolist(), n
    return [], 0
