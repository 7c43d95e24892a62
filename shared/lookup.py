"""Prompt lookup: continue a text with what followed the latest earlier occurrence of its
final n-gram (as vLLM's n-gram proposer and "prompt lookup decoding" do). The edge's n-gram
drafter and the verifier's own proposals for passes no draft covers both use it."""

from __future__ import annotations

from array import array
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
    tail = tokens[-window:]  # slice first: a session's list is long
    text = np.ascontiguousarray(tail, dtype=_WORD) if isinstance(tail, np.ndarray) \
        else array(_WORD_CODE, tail)
    buf = memoryview(text).cast("B").tobytes()  # the text as bytes: C's substring search
    last = len(text) - 1
    for n in range(min(max_n, last), max(min_n, 1) - 1, -1):
        start = _latest(buf, buf[(last + 1 - n) * _W:], last * _W)
        if start >= 0:  # the latest earlier occurrence: what followed it
            follow = start // _W + n
            return [int(t) for t in text[follow:follow + k]], n
    return [], 0


_WORD, _WORD_CODE = np.int64, "q"  # token ids as 8-byte words
_W = 8


def _latest(buf: bytes, pattern: bytes, end: int) -> int:
    """The byte offset of the latest whole-word occurrence of `pattern` in buf[:end], or -1
    (a match across word boundaries is skipped)."""
    while (at := buf.rfind(pattern, 0, end)) >= 0 and at % _W:
        end = at + len(pattern) - 1
    return at
