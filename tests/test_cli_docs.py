"""docs/cli.md is the parsers' help as generated now, and matches what the commands print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_harness import acespec

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cli.md"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FORCE_COLOR"}
    return {**env, "PYTHONSAFEPATH": "1", "NO_COLOR": "1", **extra}


def test_reference_is_current():
    r = subprocess.run([sys.executable, "scripts/gen_cli_docs.py", "--check"], cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (
        "docs/cli.md differs from the parsers; run `python scripts/gen_cli_docs.py`\n"
        f"{r.stdout}{r.stderr}")


@pytest.mark.parametrize("command", [(), ("edge", "serve"), ("cloud", "serve"), ("bench",)],
                         ids=lambda c: " ".join(("acespec",) + c))
def test_help_as_a_user_sees_it_is_in_the_reference(command: tuple[str, ...]):
    r = acespec(*command, "--help", env=_env(COLUMNS="100"), timeout=120)
    assert r.returncode == 0, r.stderr
    title = " ".join(("acespec",) + command)
    section = f"## {title}\n\n```text\n{r.stdout.rstrip(chr(10))}\n```\n"
    assert section in DOC.read_text(encoding="utf-8"), (
        f"`{title} --help` is not verbatim in docs/cli.md:\n{r.stdout}")
