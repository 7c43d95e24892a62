"""The SmolLM2 drafter's card (README.md beside the GGUF), written from build.json."""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

CATEGORY_ORDER = ("code", "writing", "explain", "other", "all")


def _sittings(card: dict) -> str:
    """How an extended run was trained, e.g. ' (a 360-step run, then extended to 720)'."""
    steps = card.get("train_sittings", [])
    if len(steps) < 2:
        return ""
    return f" (a {steps[0]}-step run, then extended to " + ", then ".join(map(str, steps[1:])) + \
        " on the grown corpus, the longer schedule from where the last left off)"


def _when(card: dict, key: str, render: Callable[[Any], str]) -> str:
    """render(card[key]) when the card has that entry, else ''."""
    value = card.get(key)
    return render(value) if value else ""


def _grown(base: str) -> str:
    """How a grown preset started, e.g. ' Grown from preset smollm2: ...'."""
    return (f"\n  Grown from preset `{base}` (built first when missing): its trained layers and "
            "norm kept, the target's next layers added with zero output projections (so the "
            "grown model starts as exactly the trained one), then all trained on.")


def _started(start: dict) -> str:
    """How a preset that trains on from a GGUF started."""
    return (f"\n  Trained on from `{start['file']}` (sha256 `{start['sha256'][:16]}…`), the\n"
            "  drafter shipped before this one: its layers and norm loaded from that GGUF\n"
            "  (dequantized), then trained on this build's material; how that one was built\n"
            "  is in its own card, in the repository's history.")


def _agreement(agree: dict) -> str:
    """The teacher-forced top-1 agreement line."""
    cats = ", ".join(f"{c} {agree[c]:.1%}" for c in CATEGORY_ORDER if c in agree and c != "all")
    return (f"Teacher-forced on those answers, the drafter's top-1 is the target's token at "
            f"**{agree['all']:.1%}** of answer positions ({cats}).\n\n")


def write_card(out: Path, card: dict, notes: str = "") -> Path:
    """out/README.md: what the drafter is, how it was built, its measured figures, and any
    hand-written `notes` (kept verbatim at the end)."""
    d, t, m = card["drafter"], card["train"], card["minutes"]
    acc = card["greedy_acceptance"]
    depths = [k for k in acc["all"] if k != "chats"]
    rows = "\n".join(f"| {c} | {acc[c]['chats']} | " + " | ".join(f"{acc[c][k]:.2f}" for k in depths)
                     + " |" for c in CATEGORY_ORDER if c in acc)
    files = "\n".join(f"| `{f['name']}` | {f['bytes'] / 2**20:.1f} MiB |"
                      for f in card["files"].values())
    corpus = card["corpus"]
    text = f"""# SmolLM2-135M-Instruct drafter (AceSpec)

SmolLM2-135M-Instruct's own first {card['layers']} of 30 decoder layers, with its embedding,
final norm and tied head (so its tokenizer and chat template, copied verbatim from the
target's GGUF), the layers and the norm then distilled from the whole target:
{card['params'] / 1e6:.1f}M parameters, of which {card['trained_params'] / 1e6:.1f}M trained.
Built by

    acespec models build-smollm2-drafter --preset {card['preset']} --seed {card['seed']}

(every stage resumable from `--work`; `answers` and `scored` can run side by side, one core
each: `acespec models build-smollm2-drafter answers` and `... scored`).

| file | size |
|---|---|
{files}

**Greedy acceptance** — mean tokens per target step, bonus included — on chats of the
ShareGPT V3 *evaluation* split (records 12,000 and later; no training stage reads them),
balanced over categories, against the target's greedy answers ({card['eval_new_tokens']}
new tokens at most; the target here is llama.cpp on the Q4_1 GGUF the verifier's float32
checkpoint is converted from):

| category | chats | {' | '.join(f'depth {k}' for k in depths)} |
|---|---|{'---|' * len(depths)}
{rows}

{_when(card, 'agreement', _agreement)}- Teacher material, all from the ShareGPT *training* split (records [0, 12000)):
  the target's own answers to {corpus['answers']['sequences']:,} first user turns
  ({corpus['answers']['tokens']:,} tokens, prompts included; greedy or at T=0.7; the torch
  target, in bfloat16 where the machine computes it natively), and
  {corpus['scored']['sequences']:,} conversations as written, teacher-forced through the
  torch target ({corpus['scored']['tokens']:,} tokens); the target's top-{card['top_k']} kept at
  every position.
- Shape: d={d['hidden_size']}, {d['num_layers']} layers, {d['num_heads']}/{d['num_kv_heads']}
  heads of {d['head_dim']}, FFN {d['intermediate_size']}, tied embeddings (frozen), RoPE θ
  {d['rope_theta']:g}; the final norm rescaled at the start so the cut model's logits spread
  as the target's do.
- Training: {t['steps']} steps of {t['batch']} × {t['seq_len']} tokens, AdamW lr {t['lr']:g}
  cosine{_sittings(card)}{', bfloat16 autocast' if t.get('autocast') else ''}, cross-entropy to the teacher's renormalised top-k at every position, sampled
  softmax (the step's teacher tokens + 4,096 uniform negatives).{_when(card, 'grown_from', _grown)}{_when(card, 'started_from', _started)}
- Minutes on {platform.machine()} ({', '.join(f'{k} {v}' for k, v in m.items())}).
"""
    if notes:
        text += "\n" + notes.strip() + "\n"
    path = Path(out) / "README.md"
    path.write_text(text)
    return path
