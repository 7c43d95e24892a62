"""The target's logprobs in OpenAI's two shapes (acespec.shared.logprobs has what they are).

Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}, ...]}, ...], "refusal": null}. Completions (the legacy shape): {"tokens",
"token_logprobs", "top_logprobs": [{token: logprob, ...}, ...], "text_offset"}, where the
top dict holds the chosen token too, as OpenAI's did (keyed by text, so tokens that share a
text share an entry: the most likely one's). A token's text is its bytes decoded
alone (a piece of a character shows as U+FFFD; `bytes` has the exact bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from acespec.shared.logprobs import TokenLogprob

Piece = Callable[[int], bytes]  # token id -> its bytes (TextCodec.piece_fn)


@dataclass(frozen=True)
class Scored:
    """Tokens of an answer with the target's logprobs and where each starts in its text."""

    ids: Sequence[int]  # [n] token ids
    entries: Sequence[TokenLogprob | None]  # [n] (None: an echoed prompt's first token)
    offsets: Sequence[int]  # [n] character offset of each token in the choice's text


def _text(piece: Piece, token: int) -> tuple[str, list[int]]:
    raw = piece(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def _entry(piece: Piece, token: int, logprob: float) -> dict:
    text, raw = _text(piece, token)
    return {"token": text, "logprob": logprob, "bytes": raw}


def chat_logprobs(piece: Piece, scored: Scored) -> dict:
    return {"content": [{**_entry(piece, token, e.logprob),
                         "top_logprobs": [_entry(piece, t, lp)
                                          for t, lp in zip(e.top_ids, e.top_logprobs)]}
                        for token, e in zip(scored.ids, scored.entries)],
            "refusal": None}


def completion_logprobs(piece: Piece, scored: Scored) -> dict:
    texts = [_text(piece, t)[0] for t in scored.ids]
    tops = [e and _top_dict(piece, text, e) for text, e in zip(texts, scored.entries)]
    return {"tokens": texts, "token_logprobs": [e and e.logprob for e in scored.entries],
            "top_logprobs": tops, "text_offset": list(scored.offsets)}


def joined(a: dict, b: dict) -> dict:
    """Two completions `logprobs` of consecutive text (an echoed prompt, then the answer)."""
    return {k: a[k] + b[k] for k in a}


@dataclass(frozen=True)
class Echo:
    """An echoed prompt: its text and, when logprobs were asked, its tokens' logprobs (the
    first token's is null: nothing precedes it)."""

    text: str
    logprobs: dict | None = None


def echo_of(piece: Piece, text: str, ids: Sequence[int], entries: Sequence[TokenLogprob] | None,
            bos_id: int | None) -> Echo:
    """The Echo of a prompt `text` encoded as `ids` (BOS, if the tokenizer added it, is not
    shown), with entries[i] the logprob of ids[i + 1] (None: not asked)."""
    if entries is None:
        return Echo(text)
    start = 1 if ids and ids[0] == bos_id else 0
    shown = list(ids[start:])
    scored = ([None] if start == 0 else []) + list(entries)
    offsets, at = [], 0
    for t in shown:
        offsets.append(at)
        at += len(_text(piece, t)[0])
    return Echo(text, completion_logprobs(piece, Scored(shown, scored, offsets)))


def _top_dict(piece: Piece, text: str, e: TokenLogprob) -> dict[str, float]:
    """Alternatives by text, most likely first, then the chosen token; a text several of
    them share keeps the most likely one's value."""
    top: dict[str, float] = {}
    for t, lp in zip(e.top_ids, e.top_logprobs):
        top.setdefault(_text(piece, t)[0], lp)
    top.setdefault(text, e.logprob)
    return top


def logprobs_field(chat: bool, piece: Piece, scored: Scored) -> dict:
    """A choice's `logprobs` field for these tokens."""
    return (chat_logprobs if chat else completion_logprobs)(piece, scored)
