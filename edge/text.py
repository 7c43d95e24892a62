"""Text <-> token ids on the edge: from the drafter's GGUF (llama.cpp's tokenizer), or from
a tokenizer.json when the drafter has no vocabulary of its own (n-gram)."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TextCodec:
    encode_fn: Callable[[str], list[int]]  # text -> ids, no BOS
    piece_fn: Callable[[int], bytes]  # id -> the bytes it stands for (specials: b"")
    bos_id: int | None
    eos_id: int | None
    vocab_hash: str

    def encode(self, text: str) -> list[int]:
        return ([self.bos_id] if self.bos_id is not None else []) + list(self.encode_fn(text))

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.piece_fn(i) for i in ids).decode("utf-8", errors="replace")

    @classmethod
    def from_drafter(cls, drafter) -> TextCodec:
        return cls(drafter.tokenize, drafter.piece, drafter.bos_id, drafter.eos_id,
                   drafter.vocab_hash())

    @classmethod
    def from_tokenizer(cls, path: str | Path) -> TextCodec:
        """A tokenizer.json (byte-level BPE pieces are mapped back to their exact bytes)."""
        from acespec.shared.tokenizer import Tokenizer

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
