"""The repository's top-level folders never stand in for installed packages of the same name.

transformers 5 imports the PyPI package `kernels` whenever it is installed; a process with
the repository root ahead of site-packages on sys.path would hand it `kernels/` (which is
only ever `acespec.kernels`). These tests hold the test command, the children it starts and
the project's own launches to the safe path, and check that a mistaken import says so.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from acespec.layout import FOLDERS
from acespec.procs import python_module

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib.util, json, sys
out = {'path': sys.path, 'origins': {}}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    out['origins'][name] = spec.origin if spec else None
print(json.dumps(out))
"""


def colliding() -> list[str]:
    """Our folder names that an installed distribution also provides as a top-level module."""
    provided = importlib.metadata.packages_distributions()
    return sorted(name for name in FOLDERS if name in provided)


def ours(path: str | None) -> bool:
    """Whether a module file lies in one of our top-level folders."""
    return path is not None and any(Path(path).resolve().is_relative_to(ROOT / f)
                                    for f in FOLDERS)


def test_the_test_process_has_no_repository_root_on_sys_path():
    """`bash scripts/test.sh` must not put the repository root on sys.path (`python -m pytest`
    does, from the root)."""
    assert not [p for p in sys.path if Path(p or ".").resolve() == ROOT], sys.path


def test_children_started_from_the_root_keep_it_off_sys_path():
    """A `python -c`/`python -m` child the tests start from the repository root inherits
    the safe path: it sees installed packages, not our folders."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *FOLDERS], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(proc.stdout)
    assert not [p for p in out["path"] if Path(p or ".").resolve() == ROOT], out["path"]
    for name in colliding():
        assert not ours(out["origins"][name]), (name, out["origins"][name])


def test_the_projects_launches_keep_the_root_off_sys_path():
    """`python_module` (how demo, bench and `cloud serve --tp` start their children) keeps
    the working directory off sys.path even without PYTHONSAFEPATH in the environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    proc = subprocess.run(python_module("site"), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    entries = [ast.literal_eval(line.strip().rstrip(","))
               for line in proc.stdout.splitlines() if line.startswith("    '")]
    assert entries, proc.stdout  # `python -m site` lists sys.path
    assert not [p for p in entries if Path(p or ".").resolve() == ROOT], entries


@pytest.mark.parametrize("name", FOLDERS)
def test_folder_names_resolve_outside_the_repository(name):
    """Each of our folder names imports what is installed under it, if anything (the way
    another library imports it: `from kernels import ...`), never the folder."""
    spec = importlib.util.find_spec(name)
    if name in colliding():
        assert spec is not None
        mod = importlib.import_module(name)
        assert not ours(getattr(mod, "__file__", None)), mod
    else:
        assert spec is None or not ours(spec.origin), spec


def test_transformers_loads_its_hub_kernels_integration():
    """What failed when the root shadowed `kernels`: transformers' own import of it."""
    pytest.importorskip("transformers")
    importlib.import_module("transformers.integrations.hub_kernels")


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_imported_top_level_says_why(folder):
    """With the root on sys.path (plain `python -c` in the root), importing a folder by its
    bare name fails with one clear ImportError, not an obscure error elsewhere."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {folder}"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"only ever acespec.{folder}" in proc.stderr, proc.stderr[-800:]
