"""Named model pairs for `--pair NAME`: a target (Hugging Face folder, for the verifier) and a
drafter (GGUF, for the edge) that share one tokenizer.

    demo     the tiny pair shipped in models/demo (a 5M-parameter stdlib code model)
    smollm2  SmolLM2-135M-Instruct: the target is converted from its Q4_1 GGUF on first use
             (acespec.models.smollm2, cached); the drafter is the distilled one when
             models/smollm2/drafter-q8_0.gguf is there, else the Q4_1 GGUF itself

Each side resolves only what it needs: the verifier the target, the edge the drafter (and
the chat template), so an edge never converts a checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from acespec.models import DEMO_DIR, DEMO_DRAFTER, DEMO_TARGET

NAMES = ("demo", "smollm2")
# The model name the edge's local API serves a pair under, and the name it always answers to.
SERVED_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "demo": "acespec-demo"}
SERVED_NAME = "acespec"
# SmolLM2's answers end with <|im_end|> (its EOS); the chat prompt a demo shows.
CHAT_SAMPLE = "Write a Python function that checks whether a number is prime."


class PairError(ValueError):
    """A --pair that cannot be used as asked (unknown name, or clashing flags)."""


def _note(msg: str) -> None:
    print(f"[pair] {msg}", file=sys.stderr, flush=True)


def _smollm2():
    """acespec.models.smollm2, which fetches and converts SmolLM2's files."""
    # lazy: its converter imports numpy, and every command's parser imports this module
    from acespec.models import smollm2

    return smollm2


def distilled_drafter() -> Path:
    return DEMO_DIR.parent / "smollm2" / "drafter-q8_0.gguf"


def target(name: str) -> Path:
    """The pair's target checkpoint folder (SmolLM2: fetched and converted if not cached)."""
    if name == "demo":
        return DEMO_TARGET
    if name == "smollm2":
        path = _smollm2().ensure_target()
        _note(f"smollm2 target: {path}")
        return path
    raise PairError(f"unknown pair {name!r}; choose from {', '.join(NAMES)}")


def drafter(name: str) -> Path:
    """The pair's drafter GGUF (SmolLM2: the distilled drafter if shipped, else the Q4_1)."""
    if name == "demo":
        return DEMO_DRAFTER
    if name == "smollm2":
        if distilled_drafter().is_file():
            _note(f"smollm2 drafter: the distilled drafter {distilled_drafter()}")
            return distilled_drafter()
        path = _smollm2().ensure_gguf()
        _note(f"smollm2 drafter: the target's own Q4_1 GGUF {path} (no distilled drafter "
              "shipped yet)")
        return path
    raise PairError(f"unknown pair {name!r}; choose from {', '.join(NAMES)}")


def chat_template(name: str) -> str | None:
    """The pair's chat template (Jinja), read from the model's GGUF; None for `demo`."""
    if name != "smollm2":
        return None
    # lazy: the cloud resolves its side of a pair without the edge's modules
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig

    gguf = LlamaDrafter(str(_smollm2().ensure_gguf()), LlamaDrafterConfig(n_ctx=16, n_seq_max=1))
    try:
        return gguf.chat_template()
    finally:
        gguf.close()


def check_files(model: str, drafter: str) -> None:
    """Read the headers of the target folder and the drafter GGUF (either may be ''), so
    that a bad file is one line (ModelFileError, FileNotFoundError) before a child starts."""
    # lazy: the target's loader and the GGUF check import torch, the cloud extra's
    from acespec.cloud.target.loader import check_checkpoint
    from acespec.cloud.verify.gap_file import check_gguf

    if model:
        check_checkpoint(model)
    if drafter:
        check_gguf(Path(drafter), "--drafter")


def render_chat(template: str, user: str) -> str:
    """The prompt text of one user message under `template`, ready for the assistant."""
    import jinja2  # lazy: the edge extra's; the cloud's parsers import this module without it

    return jinja2.Environment().from_string(template).render(
        messages=[{"role": "user", "content": user}], add_generation_prompt=True,
        bos_token="", eos_token="")


def add_argument(p: argparse.ArgumentParser, note: str = "", **flags: str) -> None:
    """Add --pair to `p` (note: appended to its help). flags maps a side ('target',
    'drafter') to the dest of the flag it replaces (e.g. target='model'); apply() fills
    those in."""
    p.add_argument("--pair", choices=NAMES, help="a named target + drafter pair instead of "
                   f"{' / '.join('--' + d.replace('_', '-') for d in flags.values())}: 'demo' "
                   "(shipped) or 'smollm2' (SmolLM2-135M-Instruct, fetched and converted on "
                   f"first use){note}")
    p.set_defaults(_pair_flags=dict(flags),
                   _pair_defaults={d: p.get_default(d) for d in flags.values()})


def add_model_flags(p, model_help: str, drafter_help: str, model_default: str = "",
                    note: str = "") -> None:
    """--model (a target's Hugging Face folder), --drafter (a GGUF) and the --pair that
    replaces both (note: appended to its help)."""
    p.add_argument("--model", default=model_default, help=model_help)
    p.add_argument("--drafter", default=str(DEMO_DRAFTER), help=drafter_help)
    add_argument(p, note=note, target="model", drafter="drafter")


def apply(args: argparse.Namespace) -> None:
    """With --pair, set the replaced flags to the pair's files; PairError if one was also
    given explicitly. Fetches what the pair needs (with progress on stderr)."""
    name = getattr(args, "pair", None)
    if not name:
        return
    clash = [d for d in args._pair_flags.values() if getattr(args, d) != args._pair_defaults[d]]
    if clash:
        raise PairError(f"--pair {name} sets {', '.join('--' + c.replace('_', '-') for c in clash)}"
                        "; pass one or the other")
    try:
        for side, dest in args._pair_flags.items():
            setattr(args, dest, str({"target": target, "drafter": drafter}[side](name)))
    except (OSError, RuntimeError) as e:  # no network, a full disk, a hash that differs
        raise PairError(f"--pair {name}: cannot fetch its files: {e}") from None
