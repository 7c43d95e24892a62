"""CI installs the versions constraints.txt names (scripts/install.sh), and that file covers
everything acespec[all] pulls in, so a new upstream release changes nothing until
`scripts/drift-check.sh --update` has run the suite against it."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"
OWN_PINS = {"acespec", "torch", "llama-cpp-python",  # pinned by the install scripts
            "pip", "setuptools", "wheel"}  # ... which keep these current


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: '{line}' is not name==version"
            out[canonical(name)] = version
    return out


def test_installed_versions_are_the_constrained_ones():
    installed = {canonical(d.metadata["Name"]): d.version
                 for d in importlib.metadata.distributions()}
    wrong = {n: (v, installed.get(n)) for n, v in pins().items()
             if n in installed and installed[n] != v}
    assert not wrong, f"installed versions differ from constraints.txt (pinned, installed): {wrong}"


def test_every_dependency_of_acespec_all_is_constrained():
    """Walk acespec[all]'s requirements as installed: each one has a pin."""
    pinned, seen, todo = pins(), set(), ["acespec"]
    extras_of = {"acespec": {"all", "edge", "cloud", "sim", "models", "dev"}}
    while todo:
        name = todo.pop()
        for req in importlib.metadata.requires(name) or []:
            dep = canonical(re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0])
            marker = req.partition(";")[2]
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)", marker)
            if extra and extra.group(1) not in extras_of.get(name, set()):
                continue
            try:
                importlib.metadata.distribution(dep)
            except importlib.metadata.PackageNotFoundError:
                continue  # not for this platform (an environment marker said so)
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    missing = sorted(seen - set(pinned) - OWN_PINS)
    assert not missing, f"constraints.txt lacks pins for {missing}"
