"""The table of modes: who drafts, who decides, what goes up (docs/design.md §3, §8).

One row per mode. The edge engine, `acespec edge`, `acespec bench`, `bench load` and the
discrete-event model read a mode's name and behaviour from here; nothing else defines one.

* drafts   who proposes the tokens a pass scores beside the decided one: the edge's
           drafter, the verifier's own proposers (prompt lookup, or its gap drafter where
           `gap`), both, or none (cloud-only decoding).
* decides  who makes the verdicts in greedy and coupled sessions: the verifier (it walks the
           tree, and the edge learns its decisions) or the edge (it walks the scores the
           verifier sends). Exact sampling is always decided at the edge.
* pipelined  the edge drafts past nodes in flight (sd drafts, sends and waits for a verdict).
* branches   the speculation tree's guessed branches beside the drafted line (without them
             the tree is one drafted line: a chain).
* gap      the verifier's gap drafter, where it runs one, proposes in the passes no edge
           draft covers.
* offline  while the verifier cannot be reached: wait (a lossless pause) or local (answer
           from the drafter, every token flagged unverified).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Who = Literal["edge", "verifier", "both", "none"]


@dataclass(frozen=True)
class Mode:
    name: str
    drafts: Who
    decides: Literal["edge", "verifier"]
    pipelined: bool = True
    branches: bool = False
    gap: bool = False
    offline: Literal["wait", "local"] = "wait"
    help: str = ""

    @property
    def edge_drafts(self) -> bool:
        """The edge's drafter drafts (the request needs one)."""
        return self.drafts in ("edge", "both")

    @property
    def cloud_only(self) -> bool:
        """Nobody speculates: the verifier decodes alone over `Generate`."""
        return self.drafts == "none"

    def verifier_decides(self, decided_sampling: bool) -> bool:
        """The verifier decides this mode's session: it decides in this mode, and the
        session's sampling lets it (greedy or coupled, not exact)."""
        return self.decides == "verifier" and decided_sampling and not self.cloud_only


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("ar", "none", "verifier", pipelined=False,
         help="cloud-only decoding: the verifier decodes alone and streams the text"),
    Mode("sd", "edge", "edge", pipelined=False,
         help="vanilla speculation: draft, send, wait for the verdicts, repeat"),
    Mode("pipeline", "edge", "edge",
         help="the edge keeps drafting past nodes in flight and walks the scores itself"),
    Mode("acespec", "edge", "verifier", branches=True,
         help="the verifier decides; the edge streams a speculation tree (drafted line "
              "and guessed branches)"),
    Mode("acespec-chain", "edge", "verifier",
         help="acespec with no guessed branches: the tree is one drafted line"),
    Mode("acespec-gap", "both", "verifier", branches=True, gap=True,
         help="acespec, and the verifier's gap drafter, where it runs one (cloud serve "
              "--gap-drafter), proposes where no edge draft covers: hybrid drafting; against "
              "a verifier without one it is acespec"),
    Mode("acespec-local", "edge", "verifier", branches=True, offline="local",
         help="acespec that answers from the drafter, flagged unverified, while the "
              "verifier is unreachable"),
    Mode("acespec-exact", "edge", "edge", branches=True,
         help="acespec where the edge decides (its rejection sampling walks the scores): "
              "what acespec runs with exact sampling"),
    Mode("colo", "verifier", "verifier", gap=True,
         help="co-located speculation: the verifier's own drafter beside the target, the "
              "edge drafts nothing (needs a verifier with --gap-drafter)"),
    Mode("cloud-lookup", "verifier", "verifier",
         help="the verifier speculates by prompt lookup alone, the edge drafts nothing"),
)}
NAMES = tuple(MODES)
# The edge's default: hybrid drafting measures as fast as acespec greedy and faster sampling
# (docs/benchmarks.md §1.2), and is acespec where the verifier runs no gap drafter.
EDGE_DEFAULT = "acespec-gap"
BENCH_DEFAULT = ("ar", "sd", "pipeline", "acespec")  # `acespec bench run`'s modes
# `bench load` runs the modes the verifier decides, and cloud-only decoding
LOAD = tuple(n for n, m in MODES.items() if m.offline == "wait"
             and (m.cloud_only or m.decides == "verifier"))
LOAD_DEFAULT = ("ar", "acespec", "acespec-gap", "colo", "cloud-lookup")


def mode(name: str) -> Mode:
    """The row named `name`; ValueError naming the modes there are."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; the modes are {', '.join(NAMES)}") from None


def check(names, allowed=NAMES, who: str = "this command") -> tuple[str, ...]:
    """`names` if every one is in `allowed`, else ValueError naming the rest."""
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"unknown modes {', '.join(bad)}; {who} runs {', '.join(allowed)}")
    return tuple(names)


def help_text(names=NAMES) -> str:
    """One line per mode, for a CLI's --help."""
    return "; ".join(f"{n}: {MODES[n].help}" for n in names)
