"""The grammar Cursor: whatever order texts are asked in (a tree's branches, a decided text,
texts past the end of text), its mask equals a fresh matcher's for the same text."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llguidance")
pytest.importorskip("torch")

from acespec.edge.api.structured import response_grammar  # noqa: E402
from acespec.shared.grammar import Cursor, GrammarError, json_grammar, tokenizer_from_json  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"enum": ["red", "green", "blue"]}}}}


@pytest.fixture(scope="module")
def vocab(tiny_pair):
    from acespec.shared.tokenizer import Tokenizer

    tok = Tokenizer.load(tiny_pair[0])
    return tokenizer_from_json(str(tok.path), tok.eos_id), tok.vocab_size


def test_masks_follow_any_order_of_texts(vocab):
    """1,500 texts, each grown from a random prefix of an earlier one by tokens the cursor
    allows (through the end of text too): every mask equals a fresh matcher's."""
    tk, size = vocab
    grammar = response_grammar({"type": "json_schema", "json_schema": {"name": "p",
                                                                       "schema": SCHEMA}})
    rng = np.random.default_rng(0)
    cursor, texts = Cursor(tk, grammar, 0, size), []
    for _ in range(1500):
        text = list(texts[rng.integers(len(texts))][:rng.integers(0, 40)]) \
            if texts and rng.random() < 0.8 else []
        for _ in range(rng.integers(1, 6)):
            allowed = cursor.mask(text)
            if allowed is None or not allowed.any():
                break
            text.append(int(rng.choice(np.nonzero(allowed)[0])))
        texts.append(text)
        got, fresh = cursor.mask(text), Cursor(tk, grammar, 0, size).mask(text)
        assert (got is None) == (fresh is None)
        assert got is None or np.array_equal(got, fresh), text
    assert any(tk.eos_token in t for t in texts)  # texts past a finished answer were asked


def test_output_from_and_text_outside_the_grammar(vocab):
    tk, size = vocab
    cursor = Cursor(tk, json_grammar(None), 3, size)
    start = cursor.mask([7, 8, 9])  # the prompt [7, 8, 9] does not count
    assert start is not None and start.sum() == 1  # only "{"
    brace = int(np.nonzero(start)[0][0])
    assert cursor.mask([7, 8, 9, brace]) is not None
    assert cursor.mask([7, 8, 9, brace, brace]) is None  # "{{": not JSON
    assert np.array_equal(cursor.mask([7, 8, 9]), start)  # and it recovers
    logits = np.zeros(size)
    shaped = cursor.apply(logits, [1, 2, 3])
    assert np.isfinite(shaped).sum() == 1 and shaped[brace] == 0


def test_a_schema_that_cannot_compile_names_the_problem():
    with pytest.raises(GrammarError, match="objectx"):
        json_grammar({"type": "objectx"})
