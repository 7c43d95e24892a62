"""The import rules of the layout: the edge imports without torch and without the cloud; the
cloud without llama.cpp, and its rooms in order (target, then verify, then serving); shared
knows neither side; libraries import no command-line module.

Each check runs in a fresh interpreter whose import system refuses the forbidden package,
then imports every module of the subpackage.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import importlib, pkgutil, sys
def hit(name):
    return any(name == b or name.startswith(b + '.') for b in {blocked!r})
class Block:
    def find_spec(self, name, path=None, target=None):
        if hit(name):
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
import acespec.{sub} as pkg
mods = [m.name for m in pkgutil.walk_packages(pkg.__path__, 'acespec.{sub}.')]
for m in mods:
    importlib.import_module(m)
leaked = sorted(n for n in sys.modules if hit(n))
assert not leaked, leaked
print(' '.join(mods))
"""


@pytest.mark.parametrize("sub,blocked,some", [
    ("edge", {"torch", "triton", "safetensors", "acespec.cloud", "acespec.kernels"},
     {"acespec.edge.session.edge_decided", "acespec.edge.speculation.grow_tree",
      "acespec.edge.drafting.llama", "acespec.edge.api.app"}),
    ("shared", {"torch", "triton", "llama_cpp", "acespec.edge", "acespec.cloud"},
     {"acespec.shared.walk"}),
    ("cloud", {"llama_cpp", "acespec.edge"}, {"acespec.cloud.serving.servicer"}),
    # The rooms of the cloud: the model knows no policy or serving; the policy no serving.
    ("cloud.target", {"llama_cpp", "acespec.edge", "acespec.cloud.verify",
                      "acespec.cloud.serving", "grpc"}, {"acespec.cloud.target.model"}),
    ("cloud.verify", {"llama_cpp", "acespec.edge", "acespec.cloud.serving", "grpc"},
     {"acespec.cloud.verify.engine"}),
])
def test_subpackage_imports_without(sub, blocked, some):
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(sub=sub, blocked=blocked)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert some <= set(proc.stdout.split())  # subpackages are walked too


CLI_MODULES = {"acespec.cli", "acespec.cli_generate", "acespec.demo", "acespec.edge.cli",
               "acespec.edge.commands", "acespec.cloud.cli", "acespec.sim.cli",
               "acespec.sim.bench_cli", "acespec.sim.bench_commands", "acespec.cloud.commands",
               "acespec.cloud.__main__"}

LIBRARY_SCRIPT = """
import importlib, pkgutil, sys
import acespec.{sub} as pkg
mods = [m.name for m in pkgutil.walk_packages(pkg.__path__, 'acespec.{sub}.')]
for m in mods:
    if m not in {cli!r}:
        importlib.import_module(m)
print(' '.join(sorted(n for n in sys.modules if n in {cli!r})))
"""


@pytest.mark.parametrize("sub", ["sim", "shared", "edge.session", "edge.api", "kernels", "cloud"])
def test_libraries_import_no_cli_module(sub):
    """A library sits below the commands: importing every module of it (its own `cli`
    aside) loads no command-line module."""
    proc = subprocess.run([sys.executable, "-c", LIBRARY_SCRIPT.format(sub=sub, cli=CLI_MODULES)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [], f"acespec.{sub} imports CLI modules: {proc.stdout}"
