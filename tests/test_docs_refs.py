"""Cross-references and history in the repository's text.

Every reference of the form `docs/design.md §5` (also ranges, docs/design.md §7-§8 or
§7–§8, and lists, docs/design.md §3, §5) names a document that exists and a numbered heading
in it (`## 5. The math` or `### 1.1 The tree`). Inside docs/, a page may name another by its
file name alone, and a bare section sign cites the page itself; elsewhere a section sign
always names its document.

Code, comments, docstrings, tests and docs speak to users, so no tracked file carries a
work-session label or an issue number: history is `git log`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()

NUM = r"\d+(?:\.\d+)*"
# A document, an optional Markdown link tail (`[docs/x.md](docs/x.md)`), then the first section
# sign; a line break between them may carry a comment marker.
DOC_REF = re.compile(
    r"(?<![\w/.-])(?P<doc>(?:[\w-]+/)*[\w-]+\.md)(?:\]\([^)\s]*\))?\)?"
    r"[ \t]*(?:\n[ \t]*(?:#+|//|\*)?[ \t]*)?"
    rf"§(?P<first>{NUM})(?P<more>(?:\s*(?:,|and|or|to|-|–)\s*§{NUM})*)")
MORE = re.compile(rf"(?P<sep>,|and|or|to|-|–)\s*§(?P<num>{NUM})")
SECTION = re.compile(rf"§(?P<num>{NUM})")
HEADING = re.compile(rf"^#{{1,6}}[ \t]+(?P<num>{NUM})\.?(?:[ \t]|$)")
FENCE = re.compile(r"^[ \t]*(```|~~~)")

# Work-session labels ("stop 29", "stops 29-31") and issue references ("#21", "(#22/#21)",
# "issue 15"). Not matched: Markdown headings ("# 1."), shebangs, HTML entities ("&#39;"),
# anchors ("(#1-demo-pair)") and CSS colours ("#333;").
LABELS = {
    "work-session label": re.compile(r"\b[Ss]tops? [0-9]+\b"),
    "issue reference": re.compile(r"(?<![\w&])#[0-9]{1,3}(?![\w-])(?!\s*;)"),
    "issue number": re.compile(r"\b[Ii]ssues? #?[0-9]+\b"),
}
# Vocabularies are data, not prose: their tokens may look like anything.
DATA_FILES = {"tokenizer.json"}


def _tracked_text() -> dict[Path, str]:
    """Every tracked text file (generated *_pb2* files left out) -> its text."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}  # not a git checkout: the tests below skip
    texts = {SELF: SELF.read_text(encoding="utf-8")}  # this file, tracked yet or not
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or "_pb2" in path.name or not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            texts[path] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


TEXTS = _tracked_text()


def headings(doc: Path) -> set[str]:
    """The section numbers of a Markdown file's numbered headings, code blocks left out."""
    found, fenced = set(), False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.add(m["num"])
    return found


def cited(m: re.Match) -> list[str]:
    """The section numbers one reference cites, ranges expanded."""
    nums = [m["first"]]
    for more in MORE.finditer(m["more"]):
        last, num = nums[-1], more["num"]
        if more["sep"] in ("-", "–", "to") and last.isdigit() and num.isdigit():
            nums += [str(n) for n in range(int(last) + 1, int(num))]
        nums.append(num)
    return nums


def in_docs(path: Path) -> bool:
    return path.suffix == ".md" and path.parent == ROOT / "docs"


def unresolved(path: Path, text: str) -> list[str]:
    """Problems with the section references in one file, as 'file:line: ...' lines."""
    rel = path.relative_to(ROOT)
    problems, covered = [], set()

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for m in DOC_REF.finditer(text):
        covered.update(s.start() for s in SECTION.finditer(text, m.start(), m.end()))
        doc = (ROOT / m["doc"]) if m["doc"].startswith("docs/") else path.parent / m["doc"]
        if not doc.is_file():
            problems.append(f"{rel}:{line(m.start())}: {m['doc']} does not exist")
            continue
        have = headings(doc)
        for num in cited(m):
            if num not in have:
                problems.append(f"{rel}:{line(m.start())}: {m['doc']} has no section {num}")
    own = headings(path) if in_docs(path) else set()
    for s in SECTION.finditer(text):
        if s.start() in covered:
            continue
        if not in_docs(path):
            problems.append(f"{rel}:{line(s.start())}: §{s['num']} names no document "
                            "(write docs/<name>.md §n)")
        elif s["num"] not in own:
            problems.append(f"{rel}:{line(s.start())}: this page has no section {s['num']}")
    return problems


def test_the_checker_reads_references_as_written():
    text = ("see docs/design.md §3, §5 and docs/benchmarks.md §7-§8; "
            "[docs/design.md](docs/design.md) §7–§8 and docs/design.md\n    # \u00a72")
    got = [(m["doc"], cited(m)) for m in DOC_REF.finditer(text)]
    assert got == [("docs/design.md", ["3", "5"]), ("docs/benchmarks.md", ["7", "8"]),
                   ("docs/design.md", ["7", "8"]), ("docs/design.md", ["2"])]
    assert HEADING.match("## 5. The math")["num"] == "5"
    assert HEADING.match("### 1.1 The tree")["num"] == "1.1"
    assert not HEADING.match("#5 not a heading")


@pytest.mark.parametrize("line, bad", [
    ("# stop 29: pacing", True), ("(stops 29-31)", True), ("see #21", True),
    ("(#22/#21)", True), ("issue 14", True), ("Issue #21: layers", True),
    ("# 1. Heading", False), ("#!/usr/bin/env bash", False), ("[a](#1-demo-pair)", False),
    ("color: #333;", False), ("&#39;", False), ("x = a  # [n] int32", False),
    ("a stop string", False), ("stops at 3 tokens", False),
])
def test_the_label_patterns_catch_labels_and_spare_markup(line, bad):
    assert any(p.search(line) for p in LABELS.values()) == bad


def test_section_references_resolve():
    if not TEXTS:
        pytest.skip("not a git checkout")
    problems = [p for path, text in TEXTS.items() for p in unresolved(path, text)]
    assert not problems, "\n".join(problems)


def test_nothing_cites_the_old_design_document():
    if not TEXTS:
        pytest.skip("not a git checkout")
    old = re.compile(r"\bDESIGN(?:\.md)?\s*§")
    hits = [f"{p.relative_to(ROOT)}:{t.count(chr(10), 0, m.start()) + 1}"
            for p, t in TEXTS.items() for m in old.finditer(t)]
    assert not hits, "cite docs/design.md §n instead: " + ", ".join(hits)


def test_no_work_session_labels_or_issue_numbers():
    if not TEXTS:
        pytest.skip("not a git checkout")
    hits = []
    for path, text in TEXTS.items():
        if path == SELF or path.name in DATA_FILES:
            continue
        for kind, pattern in LABELS.items():
            for m in pattern.finditer(text):
                n = text.count("\n", 0, m.start()) + 1
                hits.append(f"{path.relative_to(ROOT)}:{n}: {kind} {m.group()!r}")
    assert not hits, ("say what the code does and why; history is `git log`:\n"
                      + "\n".join(hits))
