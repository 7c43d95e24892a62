"""The session package's rule: a driver reads and writes the request's state only through
the Runner's public surface, and no driver imports another (the decided ones share only
their public base, acespec.edge.session.decided)."""

import ast
from pathlib import Path

import acespec.edge.session as session

DRIVERS = ("ar", "edge_decided", "grow", "no_draft", "decided")
ROOT = Path(session.__file__).parent


def _tree(name: str) -> ast.Module:
    return ast.parse((ROOT / f"{name}.py").read_text())


def _names(node: ast.AST) -> str:
    """a.b.c for an attribute chain (the names only)."""
    if isinstance(node, ast.Attribute):
        return f"{_names(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def test_drivers_touch_no_private_of_the_runner():
    for name in DRIVERS:
        bad = [f"{name}.py:{n.lineno} {_names(n)}" for n in ast.walk(_tree(name))
               if isinstance(n, ast.Attribute) and n.attr.startswith("_")
               and not n.attr.startswith("__") and _names(n.value).split(".")[-1] == "run"]
        assert not bad, bad


def test_no_driver_imports_another():
    allowed = {"decided"}  # the decided drivers' shared base
    for name in DRIVERS:
        imported = {n.module.rsplit(".", 1)[-1] for n in ast.walk(_tree(name))
                    if isinstance(n, ast.ImportFrom) and n.module
                    and n.module.startswith("acespec.edge.session.")}
        assert not (imported & set(DRIVERS)) - allowed - {name}, (name, imported)
