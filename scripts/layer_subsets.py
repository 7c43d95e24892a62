"""How well does a subset of SmolLM2-135M-Instruct's own layers agree with the whole target,
untrained? (It tells which layers a trained drafter should start from.)

Teacher-forces chats of the ShareGPT *evaluation* split (measurement only: nothing here
trains) through the whole target and through the same model with only some decoder layers
kept (embedding, final norm and tied head as the target's; the norm rescaled as
`cut_target` does), and prints the share of assistant-text positions where the subset's
top-1 equals the target's.

    .venv/bin/python scripts/layer_subsets.py --chats 16 --max-len 384
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from acespec.cloud.target.loader import load_model
from acespec.cloud.target.model import Transformer
from acespec.models import sharegpt
from acespec.models.smollm2 import assets
from acespec.models.smollm2.corpus import LlamaBatch
from acespec.models.smollm2.teacher import render_messages

SUBSETS = {  # name -> the target's layer indices kept, in order (30 layers: 0..29)
    "first 6": list(range(6)),
    "first 8": list(range(8)),
    "first 6 + last 2": list(range(6)) + [28, 29],
    "first 4 + last 4": list(range(4)) + list(range(26, 30)),
    "first 6 + last 4": list(range(6)) + list(range(26, 30)),
    "every 3rd (10)": list(range(0, 30, 3)),
    "first 10": list(range(10)),
    "first 8 + last 2": list(range(8)) + [28, 29],
}


def subset_model(full: Transformer, keep: list[int]) -> Transformer:
    model = Transformer(replace(full.args, num_layers=len(keep)))
    state = {}
    for k, v in full.state_dict().items():
        if k.startswith("model.layers."):
            i = int(k.split(".")[2])
            if i in keep:
                state[k.replace(f"model.layers.{i}.", f"model.layers.{keep.index(i)}.", 1)] = v
        else:
            state[k] = v
    model.load_state_dict(state)
    return model


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chats", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=384)
    args = ap.parse_args()
    torch.set_num_threads(2)
    target_dir = assets.ensure_target()
    full = load_model(target_dir)
    tok = LlamaBatch(assets.ensure_gguf(), n_seq=1, n_ctx_seq=64)  # the target's tokenizer
    template = tok.chat_template()
    chats = sharegpt.prompts_by_category(sharegpt.records("eval"), args.chats // 4 or 1)
    seqs, masks = [], []
    for chat in chats:
        msgs = [m for m in chat.messages if m["role"] in ("user", "assistant")][:2]
        prompt = tok.tokenize(render_messages(template, msgs[:1]))
        ids = tok.tokenize(render_messages(template, msgs))[:args.max_len]
        if len(ids) > len(prompt) + 8:
            seqs.append(torch.tensor(ids)[None])
            masks.append(torch.arange(len(ids) - 1) >= len(prompt) - 1)  # predicts an answer token
    want = [full.causal_logits(x)[0, :-1].argmax(-1) for x in seqs]
    n = int(sum(m.sum() for m in masks))
    print(f"{len(seqs)} eval chats, {n} answer positions")
    for name, keep in SUBSETS.items():
        model = subset_model(full, keep)
        x = torch.randint(100, full.args.vocab_size, (1, 256), generator=torch.Generator().manual_seed(0))
        model.model.norm.weight.mul_(full.causal_logits(x).std() / model.causal_logits(x).std())
        hit = sum(int(((model.causal_logits(s)[0, :-1].argmax(-1) == w) & m).sum())
                  for s, w, m in zip(seqs, want, masks))
        print(f"| {name} | {len(keep)} | {100 * hit / n:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
