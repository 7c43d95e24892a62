"""JSON from a client is parsed with its nesting bounded: a deep text is refused before
the parser recurses, brackets inside strings do not count, and what json.loads takes
otherwise it still takes."""

from __future__ import annotations

import json

import pytest

from acespec.edge.api.json_text import MAX_DEPTH, TooDeep, loads, too_deep


def nested(n: int) -> str:
    return "[" * n + "]" * n


def test_a_deep_text_is_refused_before_the_parser_recurses():
    with pytest.raises(TooDeep, match=f"deeper than {MAX_DEPTH}"):
        loads(nested(100_000))  # json.loads itself raises RecursionError here
    with pytest.raises(TooDeep):
        loads(('{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)).encode())


def test_the_limit_itself_parses():
    assert loads(nested(MAX_DEPTH)) == json.loads(nested(MAX_DEPTH))
    assert not too_deep(nested(MAX_DEPTH)) and too_deep(nested(MAX_DEPTH + 1))


def test_brackets_in_strings_do_not_count():
    text = json.dumps({"prompt": "[" * 5000 + '\\"{' * 300, "stop": ["]]]"]})
    assert loads(text) == json.loads(text)
    shallow_many = "[" + ",".join(["[]"] * 1000) + "]"  # many brackets, depth 2
    assert loads(shallow_many) == json.loads(shallow_many)


def test_bytes_decode_as_json_loads_decodes_them():
    body = {"prompt": "héllo"}
    for enc in ("utf-8", "utf-16", "utf-32"):
        assert loads(json.dumps(body, ensure_ascii=False).encode(enc)) == body
    with pytest.raises(UnicodeDecodeError):
        loads(b'{"prompt": "\xff"}')
    with pytest.raises(TypeError):
        loads({"already": "parsed"})
    with pytest.raises(ValueError):
        loads("{not json")
