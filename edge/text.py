"""Text <-> token ids on the edge: from the drafter's GGUF (llama.cpp's tokenizer), or from
a tokenizer.json when the drafter has no vocabulary of its own (n-gram)."""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from acespec.shared.tokenizer import Tokenizer, vocab_hash


@dataclass
class TextCodec:
    encode_fn: Callable[[str], list[int]]  # text -> ids, no BOS
    piece_fn: Callable[[int], bytes]  # id -> the bytes it stands for (specials: b"")
    bos_id: int | None
    eos_id: int | None
    vocab_hash: str
    # control tokens' text -> id ('<|im_start|>' -> 1): found in a prompt, they are that token,
    # as with llama.cpp's parse_special and `tokenizers`' added tokens (chat templates need it)
    specials: dict[str, int] = field(default_factory=dict)

    @property
    def stop_ids(self) -> frozenset[int]:
        """The tokens that end a generation: the end-of-text token, if the vocabulary has one."""
        return frozenset({self.eos_id} - {None})

    def encode(self, text: str) -> list[int]:
        """BOS (unless the text itself starts with it, as a chat template's may) + ids."""
        ids = self._encode_specials(text)
        bos = [self.bos_id] if self.bos_id is not None and ids[:1] != [self.bos_id] else []
        return bos + ids

    def encode_parts(self, parts: Sequence[tuple[str, bool]]) -> list[int]:
        """BOS + ids of (text, is_markup) pieces (see `chat_segments`): control tokens are
        parsed in markup only; everything else is text, whatever it spells."""
        ids: list[int] = []
        for text, markup in parts:
            ids += self._encode_specials(text) if markup else list(self.encode_fn(text))
        bos = [self.bos_id] if self.bos_id is not None and ids[:1] != [self.bos_id] else []
        return bos + ids

    def _encode_specials(self, text: str) -> list[int]:
        if not self.specials or not any(s in text for s in self.specials):
            return list(self.encode_fn(text))
        longest_first = sorted(self.specials, key=len, reverse=True)
        ids, pos = [], 0
        for m in re.finditer("|".join(map(re.escape, longest_first)), text):
            ids += self.encode_fn(text[pos:m.start()]) if m.start() > pos else []
            ids.append(self.specials[m.group()])
            pos = m.end()
        return ids + (list(self.encode_fn(text[pos:])) if pos < len(text) else [])

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.piece_fn(i) for i in ids).decode("utf-8", errors="replace")

    @classmethod
    def from_drafter(cls, drafter) -> TextCodec:
        table = drafter.token_table()
        # control tokens are the ones with a name but no bytes (llama.cpp renders them empty)
        specials = {t: i for i, t in enumerate(table)
                    if t.startswith("<") and t.endswith(">") and drafter.piece(i) == b""}
        return cls(drafter.tokenize, drafter.piece, drafter.bos_id, drafter.eos_id,
                   vocab_hash(table), specials)

    @classmethod
    def from_tokenizer(cls, path: str | Path) -> TextCodec:
        """A tokenizer.json (byte-level BPE pieces are mapped back to their exact bytes)."""
        tok = Tokenizer.load(path)
        table = tok.id_to_token_table()
        specials = {tok.bos_id, tok.eos_id}
        inverse = {c: b for b, c in _bytes_to_unicode().items()}

        def piece(i: int) -> bytes:
            if i in specials:
                return b""
            s = table[i]
            if all(c in inverse for c in s):
                return bytes(inverse[c] for c in s)
            return tok.decode([i]).encode("utf-8")

        return cls(lambda t: tok.encode(t, add_bos=False), piece, tok.bos_id, tok.eos_id,
                   tok.vocab_hash())


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class StreamDecoder:
    """Accepted token ids -> text as it streams, holding back incomplete UTF-8 sequences."""

    def __init__(self, codec: TextCodec):
        self.codec = codec
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Sequence[int]) -> str:
        return self._utf8.decode(b"".join(self.codec.piece_fn(i) for i in ids))

    def finish(self) -> str:
        return self._utf8.decode(b"", final=True)

    def peek(self, ids: Sequence[int]) -> str:
        """The text `ids` would add after what was fed, without feeding them."""
        ahead = codecs.getincrementaldecoder("utf-8")(errors="replace")
        ahead.setstate(self._utf8.getstate())
        return ahead.decode(b"".join(self.codec.piece_fn(i) for i in ids))


# A placeholder for message content while the chat template renders: control characters a
# template has no reason to touch, and no tokenizer's special token looks like them.
_SLOT = "\x00\x01acespec-content-{}\x01\x00"
_SLOT_RE = re.compile("\x00\x01acespec-content-(\\d+)\x01\x00")


def chat_segments(render: Callable[[list[dict]], str], messages: list[dict]
                  ) -> list[tuple[str, bool]]:
    """The chat prompt as (text, is_markup) pieces: `render` (the chat template) sees every
    message's content as a placeholder, so only the template's own text is markup, in which
    control tokens are parsed; content comes back verbatim as plain text. A template that
    rewrites content (strip, truncate) gets it rendered in place as text too."""
    slots = [{**m, "content": _SLOT.format(i)} for i, m in enumerate(messages)]
    rendered, out, pos, seen = render(slots), [], 0, []
    for m in _SLOT_RE.finditer(rendered):
        seen.append(int(m.group(1)))
        out.append((rendered[pos:m.start()], True))
        out.append((messages[seen[-1]]["content"], False))
        pos = m.end()
    out.append((rendered[pos:], True))
    if sorted(seen) != list(range(len(messages))):  # a placeholder dropped or repeated
        raise ValueError("the chat template does not render each message's content once")
    return [(t, markup) for t, markup in out if t]

