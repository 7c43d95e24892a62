"""Tokenizer loading and vocabulary identity, and the error for a model file that cannot
be read.

Edge and cloud must agree on the id -> token table, or the token ids on the wire mean
different things. `vocab_hash` fingerprints that table; both sides compute it (the cloud
from tokenizer.json, the edge from the GGUF's token list) and refuse a mismatch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

VOCAB_HASH_PREFIX = "v1:"


class ModelFileError(ValueError):
    """A model, drafter or tokenizer file is truncated, malformed or of the wrong kind. The
    message starts with the file's path and says what is wrong, on one line: the commands
    print it as their one-line error (exit 2)."""


def first_line(error: BaseException) -> str:
    """An exception's message cut to its first line (its type name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def read_json_object(path: str | Path) -> dict:
    """The JSON object a model folder's file holds (config.json, tokenizer_config.json, a
    shard index); ModelFileError naming the file when it is not UTF-8 JSON or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as e:  # bad JSON, or not UTF-8
        raise ModelFileError(f"{path}: not valid JSON ({first_line(e)})") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
        raise ModelFileError(f"{path}: holds {kind.get(type(data), 'a number')}, "
                             "not a JSON object")
    return data


def vocab_hash(tokens: Sequence[str]) -> str:
    """Stable fingerprint of an id -> token-string table (tokens[i] is the string of id i).

    sha256 over the count and the UTF-8 strings, each length-prefixed, so no two
    tables collide by concatenation. Returns 'v1:' + 16 hex digits.
    """
    h = hashlib.sha256(len(tokens).to_bytes(8, "little"))
    for tok in tokens:
        raw = tok.encode("utf-8", "surrogatepass")
        h.update(len(raw).to_bytes(4, "little"))
        h.update(raw)
    return VOCAB_HASH_PREFIX + h.hexdigest()[:16]


@dataclass(frozen=True)
class Tokenizer:
    """A `tokenizers` tokenizer plus the ids the engine needs."""

    path: Path
    backend: object  # tokenizers.Tokenizer (imported lazily)
    bos_id: int | None
    eos_id: int | None

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load `tokenizer.json` (or a directory holding one)."""
        # lazy: the tokenizers library, loaded when one is read (the parsers import this
        # module for its errors)
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {path}")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises bare Exception
            raise ModelFileError(f"{path}: not a tokenizer.json ({first_line(e)})") from None
        bos, eos = _special_ids(path.parent, backend)
        return cls(path=path, backend=backend, bos_id=bos, eos_id=eos)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_token_table(self) -> list[str]:
        """tokens[i] = string of id i; ids with no token (holes) map to ''."""
        table = [""] * self.vocab_size
        for tok, idx in self.backend.get_vocab(with_added_tokens=True).items():
            table[idx] = tok
        return table

    def vocab_hash(self) -> str:
        return vocab_hash(self.id_to_token_table())

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids (special tokens written in the text are parsed); with add_bos, BOS first
        unless the text itself starts with it (a chat template's `<|im_start|>` may be BOS)."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        bos = add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]
        return ([self.bos_id] if bos else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=True)


def _special_ids(folder: Path, backend) -> tuple[int | None, int | None]:
    """BOS/EOS ids from tokenizer_config.json when present, else common token names."""
    names: dict[str, str | None] = {"bos": None, "eos": None}
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        data = read_json_object(cfg)
        for key in names:
            value = data.get(f"{key}_token")
            names[key] = value.get("content") if isinstance(value, dict) else value
    fallbacks = {"bos": ["<|bos|>", "<s>", "<|begin_of_text|>"],
                 "eos": ["<|eos|>", "</s>", "<|endoftext|>", "<|end_of_text|>"]}
    ids: dict[str, int | None] = {}
    for key, name in names.items():
        candidates = [name] if name else fallbacks[key]
        ids[key] = next((backend.token_to_id(c) for c in candidates
                         if c and backend.token_to_id(c) is not None), None)
    return ids["bos"], ids["eos"]
