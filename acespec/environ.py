"""Environment variables AceSpec reads: all of them here, typed, read at call time."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VAR = "ACESPEC_CACHE_DIR"


def cache_dir() -> Path:
    """Where fetched and converted models live: $ACESPEC_CACHE_DIR, else ~/.cache/acespec."""
    value = os.environ.get(CACHE_DIR_VAR, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "acespec"


def config_dir() -> Path:
    """The user's settings folder: $XDG_CONFIG_HOME when it is an absolute path (the XDG
    base-directory rule: a relative one is ignored), else ~/.config."""
    value = os.environ.get("XDG_CONFIG_HOME", "").strip()
    return Path(value) if value and Path(value).is_absolute() else Path.home() / ".config"
