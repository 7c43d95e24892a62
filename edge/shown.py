"""What a reader has been shown of one answer, in local offline mode: the verified text, then
unverified text after it (acespec.edge.session.offline). `ShownText.update` turns the
engine's current verified and unverified text into what the reader must be told, in order:

  Append(text, verified)  append text, verified or not
  Confirm(end)            the text before character `end` is verified now, as shown
  Replace(offset, text)   drop what is shown from character `offset` on, then append `text`,
                          verified. With text, offset is where the verified text ends (what
                          was shown before it is confirmed first); with "", it only cuts the
                          unverified text back (what stays before offset stays unverified)

Offsets count characters from the start of the answer. Pure: no I/O, no engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from acespec.edge.session.offline import LinkEvent, Reconciled, Unverified


@dataclass(frozen=True)
class Append:
    text: str
    verified: bool = True


@dataclass(frozen=True)
class Confirm:
    end: int  # characters from the start of the answer


@dataclass(frozen=True)
class Replace:
    offset: int  # characters from the start of the answer
    text: str


Op = Append | Confirm | Replace


class SpanMirror:
    """The engine's unverified span as a consumer of its callbacks sees it: set by each
    Unverified event, settled token by token as verified tokens arrive (as Runner.emit does),
    cleared by Reconciled."""

    def __init__(self):
        self.span: tuple[int, ...] = ()  # [n] unverified token ids after the verified text

    def verified(self, ids: list[int]) -> None:
        for t in ids:
            self.span = self.span[1:] if self.span and self.span[0] == t else ()

    def event(self, e: LinkEvent) -> None:
        if isinstance(e, Unverified):
            self.span = e.span
        elif isinstance(e, Reconciled):
            self.span = ()


class ShownText:
    def __init__(self):
        self.verified = ""  # what the reader holds as verified
        self.unverified = ""  # what it holds as unverified, after that

    def update(self, verified: str, unverified: str) -> list[Op]:
        """The ops that take the reader from what it was shown to `verified` (the whole
        verified answer so far, which only grows) followed by `unverified`."""
        ops = self._advance(verified[len(self.verified):])
        self.verified = verified
        shown = self.unverified
        k = len(os.path.commonprefix([shown, unverified]))
        if k < len(shown):  # the unverified span was cut back: drop the rest of it
            ops.append(Replace(len(verified) + k, ""))
        if unverified[k:]:
            ops.append(Append(unverified[k:], verified=False))
        self.unverified = unverified
        return ops

    def _advance(self, new: str) -> list[Op]:
        """Ops for newly verified text `new` against the unverified text shown."""
        if not new:
            return []
        shown, start = self.unverified, len(self.verified)
        if not shown:
            return [Append(new)]
        k = len(os.path.commonprefix([shown, new]))
        self.unverified = shown[k:] if k == len(new) else ""
        if k == len(new):  # all of it was shown already
            return [Confirm(start + k)]
        if k == len(shown):  # all that was shown holds, and more follows
            return [Confirm(start + k), Append(new[k:])]
        return ([Confirm(start + k)] if k else []) + [Replace(start + k, new[k:])]
