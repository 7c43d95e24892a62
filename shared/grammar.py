"""Structured output: a grammar's token mask over the logits (docs/design.md §5).

A request's grammar (JSON schema or a tool call, compiled to llguidance's grammar format by
the edge's API) travels in `Sampling.grammar`. Both sides mask with it from the same text: the
verifier masks the target's logits, so p~ is the constrained target's and verification stays
exact with respect to it; the drafter masks its own, so its drafts are always in the grammar.
The mask depends on the output so far only (from `output_from`, as the penalties count it),
so `Cursor.mask(text)` takes the whole text and follows it with consume and rollback: a
decided session walks forward, a speculation tree jumps between branches.

llguidance is loaded lazily (`_llguidance`): it is needed only by a request that asks for
structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from acespec.shared.config import ConfigError


def _llguidance():
    """The llguidance module, loaded by the first request that asks for structure."""
    import llguidance  # lazy: a native library that only structured output needs

    return llguidance


class GrammarError(ConfigError):
    """A grammar or schema llguidance cannot compile; the message says why."""


def json_grammar(schema: dict | None, options: dict | None = None, check: bool = True) -> str:
    """The grammar of JSON text valid against `schema` (None: any JSON object), with
    llguidance's JSON options (e.g. {"whitespace_flexible": False}); GrammarError naming the
    problem when llguidance cannot compile it (check=False: left to check_generates)."""
    try:
        grammar = _llguidance().LLMatcher.grammar_from_json_schema(
            {"type": "object"} if schema is None else schema, defaults=options)
    except (ValueError, TypeError, RuntimeError) as e:
        raise GrammarError(f"the JSON schema cannot be compiled: {e}") from None
    if check:
        check_grammar(grammar)
    return grammar


def check_grammar(grammar: str) -> None:
    is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise GrammarError(f"the grammar cannot be compiled: {'; '.join(messages)[:300]}")


def new_matcher(tokenizer, grammar: str):
    """A matcher of `grammar` at the start of text, over `tokenizer`'s vocabulary (None: the
    256 bytes); GrammarError naming the problem when it cannot be built. Building it builds
    the grammar's lexer, the bulk of what a grammar costs (seconds for a large schema); a
    copy of it (LLMatcher.deep_copy) costs microseconds."""
    m = _llguidance().LLMatcher(tokenizer or _byte_tokenizer(), grammar, log_level=0)
    if m.is_error():
        raise GrammarError(f"the grammar cannot be compiled: {m.get_error()[:300]}")
    return m


def check_generates(grammar: str, pristine=None, steps: int = 8) -> None:
    """GrammarError when `grammar` cannot be compiled, generates no text at all (a schema
    that is only a $ref cycle, {"$ref": "#"}: its matcher, asked for the first token, stops),
    or cannot be followed over its first `steps` tokens (each the lowest id it allows):
    llguidance gives up on a grammar past its limits as it is followed (an object of more
    than about 500 optional properties, after its "{"), and a mask it cannot compute would
    leave the answer unconstrained. `pristine`: the grammar's new_matcher, if one is built
    (else one over bytes is)."""
    m = (pristine or new_matcher(None, grammar)).deep_copy()
    for step in range(steps):
        allowed = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8),
                                bitorder="little")
        if m.is_error() or m.is_stopped():
            if step == 0:
                raise GrammarError("it generates no text (no JSON value satisfies it: a $ref "
                                   "cycle?)")
            break  # (stopped: a whole answer)
        if not m.consume_token(int(np.flatnonzero(allowed)[0])) or m.is_error():
            raise GrammarError(f"it is too complex to follow: {_first_line(m.get_error())}")


def _first_line(error: str) -> str:
    return error.split("<state>")[0].strip().splitlines()[0][:300] if error else "unknown"


@lru_cache(maxsize=1)
def _byte_tokenizer():
    """llguidance's tokenizer of a vocabulary of the 256 bytes and an end of text."""
    return tokenizer_from_pieces([bytes([b]) for b in range(256)] + [b"<eos>"], 256, None,
                                 [256], lambda s: list(s.encode("utf-8")))


@lru_cache(maxsize=4)
def tokenizer_from_json(path: str, eos_id: int | None):
    """llguidance's tokenizer from a tokenizer.json (about a second: cached)."""
    with open(path, encoding="utf-8") as f:
        return _llguidance().LLTokenizer(f.read(), eos_token=eos_id)


def tokenizer_from_pieces(pieces: Sequence[bytes], eos_id: int, bos_id: int | None,
                          specials: Sequence[int], encode) -> object:
    """llguidance's tokenizer from each id's bytes (specials: their names, marked) and an
    encoder (text -> ids), for a vocabulary known only through a drafter."""
    class Vocab:
        tokens = list(pieces)
        eos_token_id, bos_token_id = eos_id, bos_id
        special_token_ids = list(specials)

        def __call__(self, s):
            return encode(s.decode("utf-8") if isinstance(s, bytes) else s)
    ll = _llguidance()
    return ll.LLTokenizer(ll.TokenizerWrapper(Vocab()))


class Cursor:
    """A grammar's matcher, kept at the text it was last asked about. It keeps the matcher
    at the start of text too (`pristine`, built once, or given: new_matcher's over the same
    tokenizer), and copies it where a matcher must start over."""

    def __init__(self, tokenizer, grammar: str, output_from: int, vocab: int,
                 pristine=None):
        self.tokenizer, self.grammar = tokenizer, grammar
        self.pristine = pristine or new_matcher(tokenizer, grammar)
        self.matcher = self.pristine.deep_copy()
        self.output_from, self.vocab = output_from, vocab
        self.consumed: list[int] = []  # output tokens the matcher holds

    def mask(self, text: Sequence[int]) -> np.ndarray | None:
        """[V] bool: the tokens the grammar allows after `text` (prompt + output); None when
        the output so far is not in the grammar (drafts of another branch may not be)."""
        out = list(text[self.output_from:])
        same = _common(self.consumed, out)
        if same < len(self.consumed):
            stopped = self.matcher.is_stopped()  # (past the end of text: llguidance's
            # rollback does not restore the state before it, so the matcher is rebuilt)
            if not stopped:
                self.matcher.rollback(len(self.consumed) - same)
            del self.consumed[same:]
            if stopped:
                self.matcher = self._rebuilt()
        for t in out[same:]:
            if not self.matcher.consume_token(t):
                self.matcher = self._rebuilt()
                return None
            self.consumed.append(t)
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.vocab].astype(bool)

    def _rebuilt(self):
        """A matcher at `consumed` again, after a token it refused (an error state sticks)."""
        m = self.pristine.deep_copy()
        m.consume_tokens(self.consumed)
        return m

    def apply(self, logits: np.ndarray, text: Sequence[int]) -> np.ndarray:
        """[V] logits with what the grammar forbids after `text` at -inf (as they are when
        the text is outside the grammar)."""
        allowed = self.mask(text)
        if allowed is None:
            return logits
        out = np.array(logits, dtype=np.float64)
        out[~allowed[:len(out)]] = -np.inf
        return out


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists (asked per scored node: the whole
    output is compared, so the comparison runs in numpy, not a Python loop)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case: one text extends the other
        return n
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0])
