"""Environment variables AceSpec reads: all of them here, typed, read at call time."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VAR = "ACESPEC_CACHE_DIR"


def cache_dir() -> Path:
    """Where fetched and converted models live: $ACESPEC_CACHE_DIR, else ~/.cache/acespec."""
    value = os.environ.get(CACHE_DIR_VAR, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "acespec"
