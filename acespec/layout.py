"""The repository's top-level folders are subpackages of `acespec`, never packages of their own.

`kernels/` is `acespec.kernels`, `models/` is `acespec.models`, and so on (pyproject.toml's
package-dir). PyPI has packages with some of these names (transformers 5 imports `kernels`),
so a process that puts the repository root on sys.path ahead of site-packages (`python -m`
or `python -c` started in a clone's root) would hand them our folders. Each folder's
`__init__` calls `require_subpackage`, so that mistake is one clear ImportError instead of
an obscure failure deep inside another library. See docs/design.md §2.
"""

from __future__ import annotations

FOLDERS = ("edge", "cloud", "proto", "shared", "kernels", "sim", "models")


def require_subpackage(name: str, path: str) -> None:
    """ImportError unless the module `name` (a folder's `__name__`) is `acespec.<folder>`."""
    if name.startswith("acespec."):
        return
    raise ImportError(
        f"'{name}' resolved to AceSpec's folder {path}, which is only ever acespec.{name}: the "
        "repository root is on sys.path ahead of the installed packages. Start Python outside "
        "the repository root, or with the safe path (python -P, PYTHONSAFEPATH=1).", name=name)
