"""The demo pair's model card (README.md beside the files), written from build figures."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


def write_card(out: Path, card: dict) -> Path:
    c, p = card["corpus"], card["preset"]
    acc = ", ".join(f"depth {d}: **{v}**" for d, v in card["greedy_acceptance"].items())
    text = f"""# AceSpec demo model pair

Built by `acespec models build-demo --seed {card['seed']}` (writes `models/demo`; checkpoints
in `runs/build-demo`, resumable) — deterministic given the seed and the Python version (the
corpus is the running interpreter's standard library).

| | target (`target/`, HF Llama) | drafter (`drafter-*.gguf`, llama) |
|---|---|---|
| parameters | {card['params']['target']:,} | {card['params']['drafter']:,} |
| shape | {_shape(p['target'])} | {_shape(p['drafter'])} |
| training steps × batch × seq | {_train(p['target_train'])} | {_train(p['drafter_train'])} |
| validation perplexity | {card['valid_perplexity']['target']:.2f} | {card['valid_perplexity']['drafter']:.2f} |

**Greedy acceptance** (mean tokens per target step, bonus included; Q8_0 GGUF drafter vs the
torch target; {p['eval_prompts']} held-out prompts of 64 tokens, {p['eval_tokens']} tokens
generated each): {acc}.

- Corpus: Python {platform.python_version()} standard library, `*.py` outside site-packages
  (PSF licence), {c['n_train_files']} train / {c['n_valid_files']} validation files split by
  file with the seed; {card['train_tokens_in_corpus']:,} training tokens; corpus sha256
  `{c['sha256']}`. Validation files are listed in `build.json`.
- Tokenizer: byte-level BPE, {p['vocab_size']} tokens, `<|bos|>` = 0, `<|eos|>` = 1.
- Drafter objective: {_objective(p)}
- Build: {card['build_minutes']} minutes wall on {platform.machine()} ({_cpus()} cores), one core
  per model{' (other work shared the machine)' if card.get('shared_machine', True) else ''}.
{_comparison(out)}"""
    path = out / "README.md"
    path.write_text(text)
    return path


def _objective(p: dict) -> str:
    if p.get("drafter_objective", "ce") == "ce":
        return ("next-token cross-entropy on the same corpus, trained alongside the target "
                "(one core each).")
    return (f"distillation from the trained target: cross-entropy to its renormalised top-"
            f"{p['distill_top_k']} next-token distribution, cached once for a pool of "
            f"{p['drafter_train']['steps'] // p['distill_pool_every']} training windows "
            f"(cycled), so the drafter trains after the target.")


def _comparison(out: Path) -> str:
    """The equal-time objective comparison behind the choice, when it was run."""
    path = out / "objective_comparison.json"
    if not path.is_file():
        return ""
    c = json.loads(path.read_text())
    rows = "\n".join(
        f"| {name} | {a['train_steps']} | {a['seconds']:.0f} | {a['valid_perplexity']} | "
        f"{a['greedy_acceptance']['4']} | {a['greedy_acceptance']['8']} |"
        for name, a in c["arms"].items())
    return f"""
**Why this objective** (`acespec models compare-objectives --steps {c['steps_budget']}`, this
drafter shape, same seed and initialisation; the distillation arm pays for its teacher cache,
{c['teacher_cache']['seconds']:.0f} s, out of the cross-entropy arm's time; acceptance: 16
held-out prompts, 64 tokens each, Q8_0 vs the torch target — `objective_comparison.json`):

| objective | steps | seconds | valid ppl | acceptance d=4 | d=8 |
|---|---|---|---|---|---|
{rows}

Perplexity is measured on next-token targets, which cross-entropy optimises directly;
acceptance is what the drafter is for, and distillation wins it.
"""


def _shape(d: dict) -> str:
    return (f"d={d['hidden_size']}, {d['num_layers']} layers, {d['num_heads']}/"
            f"{d['num_kv_heads']} heads, FFN {d['intermediate_size']}, "
            f"{'tied' if d['tie_word_embeddings'] else 'untied'}")


def _train(t: dict) -> str:
    return f"{t['steps']} × {t['batch']} × {t['seq_len']}"


def _cpus() -> int:
    return os.cpu_count() or 0
