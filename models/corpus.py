"""The demo pair's corpus: the Python standard library of the running interpreter.

Every machine with Python has it (PSF licence). Files are listed in a fixed order
(sorted relative paths, site-packages excluded) and split into train/validation by file
with a seeded RNG, so a build is reproducible on the same Python version.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Corpus:
    root: Path
    train: list[str]  # relative paths
    valid: list[str]
    sha256: str  # over every (path, content) in list order

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8", errors="replace")

    def card(self) -> dict:
        return {"root": str(self.root), "n_train_files": len(self.train),
                "n_valid_files": len(self.valid), "sha256": self.sha256,
                "valid_files": self.valid}


def stdlib_files(root: Path | None = None) -> tuple[Path, list[str]]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and p.is_file())
    return root, files


def load_corpus(seed: int = 0, valid_fraction: float = 0.05, limit: int | None = None,
                root: Path | None = None) -> Corpus:
    """The corpus split; `limit` keeps only the first files (tiny test builds)."""
    root, files = stdlib_files(root)
    files = files[:limit] if limit else files
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(valid_fraction * len(files)))
    valid_idx = set(order[:n_valid])
    return Corpus(root=root, train=[f for i, f in enumerate(files) if i not in valid_idx],
                  valid=[f for i, f in enumerate(files) if i in valid_idx], sha256=h.hexdigest())
