"""The edge imports without torch; the cloud imports without llama.cpp.

Each check runs in a fresh interpreter whose import system refuses the forbidden package,
then imports every module of the subpackage.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
import acespec.{sub} as pkg
mods = [m.name for m in pkgutil.walk_packages(pkg.__path__, 'acespec.{sub}.')]
for m in mods:
    importlib.import_module(m)
leaked = sorted(set(n.split('.')[0] for n in sys.modules) & {blocked!r})
assert not leaked, leaked
print(len(mods))
"""


@pytest.mark.parametrize("sub,blocked", [
    ("edge", {"torch", "triton", "safetensors"}),
    ("shared", {"torch", "triton", "llama_cpp"}),
    ("cloud", {"llama_cpp"}),
])
def test_subpackage_imports_without(sub, blocked):
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(sub=sub, blocked=blocked)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
