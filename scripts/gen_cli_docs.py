"""Write docs/cli.md, the CLI reference, from the `acespec` argparse parsers.

    python scripts/gen_cli_docs.py           # (re)write docs/cli.md
    python scripts/gen_cli_docs.py --check   # exit 1 with a unified diff if it is stale

Each command's section is its `--help` text exactly as `acespec ... --help` prints it at a
100-column terminal, except that defaults pointing into the installed package are written
relative to it (`<acespec.models>/demo`) so the file does not depend on where it is installed.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from pathlib import Path

# argparse sizes help to $COLUMNS and, from Python 3.14, colours it; both are fixed here,
# before any parser or formatter exists, so every machine writes the same text.
WIDTH = 100
os.environ["COLUMNS"] = str(WIDTH)
os.environ["NO_COLOR"] = "1"
os.environ.pop("FORCE_COLOR", None)

from acespec.cli import build_parser  # noqa: E402  (after COLUMNS is fixed)

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
# Packages whose folders may appear in path defaults, most specific first.
PACKAGES = ("acespec.models", "acespec.edge", "acespec.cloud", "acespec.sim", "acespec.kernels",
            "acespec.shared", "acespec.proto", "acespec")


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Yield (command path, parser) for `parser` and every sub-command below it, depth first,
    in the order the sub-commands were added; an alias yields its parser once."""
    yield path, parser
    seen: set[int] = set()
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            if id(sub) not in seen:
                seen.add(id(sub))
                yield from walk(sub, path + (name,))


def _package_dirs() -> list[tuple[str, str]]:
    """(absolute folder, `<package>`) for each AceSpec package that is installed."""
    dirs = []
    for name in PACKAGES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an extra that is not installed
            continue
        dirs.append((str(Path(module.__file__).resolve().parent), f"<{name}>"))
    return dirs


def relocate_defaults(parser: argparse.ArgumentParser) -> None:
    """Rewrite string defaults inside an installed package as `<package>/rest`, in place."""
    dirs = _package_dirs()
    for _, p in walk(parser):
        for action in p._actions:
            if not isinstance(action.default, str):
                continue
            for folder, label in dirs:
                if action.default == folder or action.default.startswith(folder + os.sep):
                    rest = action.default[len(folder):].replace(os.sep, "/")
                    action.default = label + rest
                    break


def _anchor(title: str) -> str:
    """The GitHub anchor of a Markdown heading made of words, spaces and hyphens."""
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def render() -> str:
    """The whole text of docs/cli.md."""
    parser = build_parser()
    relocate_defaults(parser)
    commands = [(" ".join(("acespec",) + path), p) for path, p in walk(parser)]
    out = ["# CLI reference", "",
           "Generated from the argparse parsers by `python scripts/gen_cli_docs.py`; do not "
           "edit by hand. Defaults inside the installed package read `<acespec.models>/...` "
           "and so on.", "",
           "## Commands", ""]
    for title, _ in commands:
        depth = title.count(" ")
        out.append(f"{'  ' * depth}- [`{title}`](#{_anchor(title)})")
    for title, p in commands:
        out += ["", f"## {title}", "", "```text", p.format_help().rstrip("\n"), "```"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gen_cli_docs.py", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 and print a diff if docs/cli.md is stale")
    args = ap.parse_args(argv)
    text = render()
    if not args.check:
        DOC.write_text(text, encoding="utf-8")
        return 0
    current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    if current == text:
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        current.splitlines(keepends=True), text.splitlines(keepends=True),
        "docs/cli.md", "docs/cli.md (generated)"))
    print("\ndocs/cli.md is stale: run `python scripts/gen_cli_docs.py`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
