"""JSON from a client, parsed with its nesting bounded.

Python's json parser recurses once per level, so a body of 100,000 '[' runs into the
interpreter's recursion limit; unwinding from there, any finalizer that runs at that depth
(a ctypes call in a drafter's __del__) fails too. A text nested deeper than MAX_DEPTH is
refused before it is parsed: no request, schema or tool call needs more."""

from __future__ import annotations

import json
import re

MAX_DEPTH = 128
# a string (skipped whole, escapes included) or one bracket
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


class TooDeep(ValueError):
    """The text nests arrays and objects deeper than MAX_DEPTH."""


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the text's arrays and objects nest deeper than limit."""
    if text.count("[") + text.count("{") <= limit:
        return False  # too few brackets to nest that deep
    level = 0
    for m in _TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            level += 1
            if level > limit:
                return True
        elif c in "]}":
            level -= 1
    return False


def loads(data: str | bytes):
    """json.loads, but TooDeep (a ValueError) for a text nested deeper than MAX_DEPTH.
    Bytes are decoded as json.loads decodes them (UTF-8, -16 or -32, told apart by their
    first bytes): UnicodeDecodeError where they are not; TypeError for neither text nor
    bytes."""
    text = data.decode(json.detect_encoding(data)) if isinstance(data, bytes) else data
    if not isinstance(text, str):
        raise TypeError(f"JSON must be text, not {type(data).__name__}")
    if too_deep(text):
        raise TooDeep(f"nested deeper than {MAX_DEPTH} levels")
    return json.loads(text)
