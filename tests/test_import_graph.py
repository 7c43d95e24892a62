"""The project's modules import one another without a cycle, and import at their top.

The graph is read from the source (the AST of every module of every folder in pyproject's
package-dir), not from a running interpreter, so an import inside a function counts as an
edge: moving an import into a function hides a cycle from Python, not from this test. An
import under `if TYPE_CHECKING:` counts too. `from acespec.x import y` is an edge to
`acespec.x.y` when that is a module, else to `acespec.x`; a package's `__init__` that runs on
the way is not an edge (re-exporting submodules is not a cycle).

An import inside a function is for a heavy optional dependency or a command's lazy start,
and says so in a comment starting `# lazy:`, which covers an import statement when it stands
on the statement's first line or among the comment lines right above it, and covers the import
statements that follow it in the same run (import statements one after another in a function
body; blank lines between them are allowed), so one comment serves a group. Every module of
the project is held to this, whatever it imports; project modules imported inside functions
are also few (MAX_IN_FUNCTION).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]

MAX_IN_FUNCTION = 40  # import statements of project modules inside functions, outside tests/
LAZY = "# lazy:"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, e.g. "acespec.sim.des"
    target: str  # the imported project module
    line: int
    in_function: bool


def package_dirs() -> dict[str, Path]:
    """pyproject's package-dir: each package with the folder that holds it."""
    text = (ROOT / "pyproject.toml").read_text()
    if tomllib is not None:
        dirs = tomllib.loads(text)["tool"]["setuptools"]["package-dir"]
    else:  # the one line `package-dir = { "acespec" = "acespec", ... }`
        line = re.search(r"^package-dir = \{(.*)\}$", text, re.M).group(1)
        dirs = dict(re.findall(r'"([\w.]+)" = "([\w./]+)"', line))
    return {pkg: ROOT / folder for pkg, folder in dirs.items()}


def project_modules() -> dict[str, Path]:
    """Every module of the project by dotted name, with its file."""
    modules = {}
    for pkg, folder in package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((pkg, *parts))] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module that `import name` loads last: the longest known prefix."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


class _Imports(ast.NodeVisitor):
    """Collects a module's project imports, noting which sit inside a function."""

    def __init__(self, module: str, is_package: bool, modules: dict[str, Path]):
        self.module, self.modules = module, modules
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0
        self.found: list[Import] = []

    def _add(self, target: str | None, line: int) -> None:
        if target is not None and target != self.module:
            self.found.append(Import(self.module, target, line, self.depth > 0))

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(_resolve(alias.name, self.modules), node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")[:len(self.package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self._add(sub if sub in self.modules else _resolve(base, self.modules), node.lineno)


def project_imports() -> list[Import]:
    modules = project_modules()
    found = []
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", modules)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        found += visitor.found
    return found


def _says_lazy(lines: list[str], node: ast.stmt) -> bool:
    """`# lazy:` on the statement's first line or in the comment lines right above it."""
    if LAZY in lines[node.lineno - 1]:
        return True
    above = node.lineno - 2
    while above >= 0 and lines[above].lstrip().startswith("#"):
        if lines[above].lstrip().startswith(LAZY):
            return True
        above -= 1
    return False


def unexplained_lazy_imports(source: str) -> list[int]:
    """The lines of the import statements inside functions that no `# lazy:` comment covers
    (the rule in the module's docstring)."""
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for _, body in ast.iter_fields(node):
            if not (isinstance(body, list) and body and isinstance(body[0], ast.stmt)):
                continue
            covered = False  # by a comment earlier in this run of imports
            for stmt in body:
                if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    covered = False
                    continue
                covered = covered or _says_lazy(lines, stmt)
                if in_function and not covered:
                    found.append(stmt.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module
    (Tarjan's algorithm, iterative; then a path around the component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_cycle_in(component, edges) for component in components]


def _cycle_in(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A path from the component's first module back to itself (breadth-first: a shortest)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, ()) & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in component {component}")


def test_cycles_finds_a_cycle_and_only_one_per_component():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(edges) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_resolves_relative_and_submodule_imports():
    modules = {"acespec.sim": Path("__init__.py"), "acespec.sim.des": Path("des.py"),
               "acespec.sim.trace": Path("trace.py"), "acespec.shared": Path("__init__.py")}
    source = ("from . import trace\nfrom .des import X\n"
              "def f():\n    from acespec.shared import thing\n")
    visitor = _Imports("acespec.sim.stages", False, modules)
    visitor.visit(ast.parse(source))
    assert [(i.target, i.in_function) for i in visitor.found] == [
        ("acespec.sim.trace", False), ("acespec.sim.des", False), ("acespec.shared", True)]


def test_a_lazy_comment_covers_its_run_of_imports():
    source = """import os

def f():
    # lazy: heavy, and a second line
    # of the same comment
    import a

    from b import c
    x = 1
    import d
    import e  # lazy: said on its line
    import g


def h():
    import i
    # lazy: an import after this comment is covered, not one before it
    import j
"""
    assert unexplained_lazy_imports(source) == [10, 16]


def test_the_import_graph_has_no_cycle():
    edges: dict[str, set[str]] = {}
    for imp in project_imports():
        edges.setdefault(imp.source, set()).add(imp.target)
        edges.setdefault(imp.target, set())
    assert len(edges) > 100  # the walk found the project
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_few_imports_inside_functions():
    inside = {(imp.source, imp.line) for imp in project_imports() if imp.in_function}
    per_file: dict[str, int] = {}
    for source, _ in inside:
        per_file[source] = per_file.get(source, 0) + 1
    worst = sorted(per_file.items(), key=lambda kv: -kv[1])[:10]
    assert len(inside) <= MAX_IN_FUNCTION, (
        f"{len(inside)} project imports inside functions (at most {MAX_IN_FUNCTION}); "
        f"most in: {worst}")


def test_every_import_inside_a_function_says_why():
    bad = [f"{path.relative_to(ROOT)}:{line}" for path in project_modules().values()
           for line in unexplained_lazy_imports(path.read_text())]
    assert not bad, (f"imports inside functions without a `{LAZY}` comment on their line or "
                     "just above (move them to the top of the module, or say why they wait): "
                     + ", ".join(bad))
