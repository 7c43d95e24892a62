"""`acespec generate`: in-process speculative decoding of a prompt with a (target, drafter)
pair, no network. Streams the text and prints acceptance figures. Its flags are in
acespec.cli."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from acespec import pairs
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
from acespec.edge.drafting.ngram import NgramDrafter
from acespec.shared.config import ConfigError, SamplingParams
from acespec.shared.tokenizer import Tokenizer
from acespec.sim.local import generate_local


class CliError(Exception):
    """A user-facing problem with the command's inputs."""


def _load_pair(args):
    from acespec.cloud.target.loader import load_model, set_threads  # lazy: torch, on use only

    pairs.apply(args)
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise CliError(f"no target checkpoint at {model_dir} (need config.json); build the demo "
                       "pair with `acespec models build-demo` or pass --model DIR")
    tok = Tokenizer.load(model_dir)
    target = load_model(model_dir, dtype=args.dtype)
    set_threads(target)
    if args.drafter == "ngram":
        return tok, target, NgramDrafter(target.args.vocab_size)
    if not Path(args.drafter).is_file():
        raise CliError(f"no drafter GGUF at {args.drafter}; pass --drafter FILE or 'ngram'")
    drafter = LlamaDrafter(args.drafter, LlamaDrafterConfig(n_seq_max=1))
    if drafter.vocab_hash() != tok.vocab_hash():
        raise CliError(f"vocabulary mismatch: drafter {drafter.vocab_hash()} vs target "
                       f"{tok.vocab_hash()}; the pair must share one tokenizer")
    return tok, target, drafter


def run(args) -> int:
    try:
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
        if args.depth < 1 or args.max_tokens < 1:
            raise CliError("--depth and --max-tokens must be >= 1")
        tok, target, drafter = _load_pair(args)
    except (CliError, ConfigError, FileNotFoundError, ValueError) as e:
        print(f"acespec generate: error: {e}", file=sys.stderr)
        return 2
    prompt = tok.encode(args.prompt)
    printer = _Printer(tok) if not args.json else None
    t0 = time.perf_counter()
    out, stats = generate_local(target, drafter, prompt, args.max_tokens, args.depth, sampling,
                                seed=args.seed, eos_id=tok.eos_id,
                                on_tokens=printer.add if printer else None)
    figures = {**stats.as_dict(), "depth": args.depth, "wall_seconds": round(time.perf_counter() - t0, 3)}
    if args.json:
        print(json.dumps({"text": tok.decode(out), "token_ids": out, "stats": figures}))
    else:
        printer.finish()
        print(f"\n[{stats.emitted} tokens, {stats.steps} target steps, mean acceptance length "
              f"{stats.mean_acceptance_length:.2f} (depth {args.depth}), accepted "
              f"{stats.accepted}/{stats.drafted} drafts, {stats.tokens_per_s:.1f} tok/s]",
              file=sys.stderr)
    return 0


class _Printer:
    """Streams decoded text, holding back an incomplete UTF-8 sequence at the end."""

    def __init__(self, tok):
        self.tok, self.ids, self.shown = tok, [], 0

    def add(self, new: list[int]) -> None:
        self.ids += new
        text = self.tok.decode(self.ids).rstrip("\ufffd")
        sys.stdout.write(text[self.shown:])
        sys.stdout.flush()
        self.shown = max(self.shown, len(text))

    def finish(self) -> None:
        text = self.tok.decode(self.ids)
        sys.stdout.write(text[self.shown:] + "\n")
        sys.stdout.flush()
