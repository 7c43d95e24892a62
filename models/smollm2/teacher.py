"""The torch target as a teacher: its first layers as a student, its top-k over real text.

`cut_target` keeps the target's first n decoder layers with its embedding, final norm and
tied head: a valid Llama of n layers that llama.cpp runs as it runs the target.
`score_corpus` teacher-forces conversations through the whole target (one causal prefill per
batch of conversations) and keeps its top-k next-token distribution at every position, in
the chunk format of `acespec.models.smollm2.corpus` (so training reads both alike).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import torch

from acespec.cloud.target.loader import load_model
from acespec.cloud.target.model import Transformer
from acespec.models.gguf_to_hf import convert_weights, hf_config
from acespec.models.smollm2.corpus import _compiled

log = logging.getLogger(__name__)


def cut_target(target_dir: Path, layers: int) -> Transformer:
    """The target's first `layers` decoder layers, own embedding, norm and head (float32)."""
    full = load_model(target_dir)
    if not 1 <= layers <= full.args.num_layers:
        raise ValueError(f"layers must be in [1, {full.args.num_layers}], not {layers}")
    args = replace(full.args, num_layers=layers)
    model = Transformer(args)
    state = {k: v for k, v in full.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    model.load_state_dict(state)
    _match_logit_scale(full, model)
    return model


@torch.no_grad()
def grow(model: Transformer, trained: dict[str, torch.Tensor]) -> None:
    """Start a deeper cut from a trained shallower one (its state dict): its layers and final
    norm are loaded, and each further layer (the target's own) gets zero output projections
    (o_proj, down_proj), so it adds nothing to the residual stream until trained: the grown
    model computes exactly what the trained one does."""
    n = 1 + max(int(k.split(".")[2]) for k in trained if k.startswith("model.layers."))
    if n >= model.args.num_layers:
        raise ValueError(f"cannot grow {n} trained layers into {model.args.num_layers}")
    missing, unexpected = model.load_state_dict(trained, strict=False)
    if unexpected or any(not k.startswith("model.layers.") or int(k.split(".")[2]) < n
                         for k in missing):
        raise ValueError(f"not a shallower cut of this model: {unexpected or missing}")
    for layer in model.model.layers[n:]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def fast_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the device computes it natively (CUDA; a CPU with AVX512-BF16 or
    AMX, through oneDNN), else float32 (emulated bfloat16 would be slower)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    native = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.bfloat16 if native else torch.float32


@torch.no_grad()
def start_from_gguf(model: Transformer, path: Path) -> None:
    """Load a drafter GGUF's decoder layers and final norm into `model`, a cut of the same
    depth (its embedding and head stay the target's own, which the drafter's are, frozen):
    training goes on from a shipped drafter, whose build checkpoints did not survive."""
    reader = gguf.GGUFReader(str(path))
    cfg = hf_config(reader)
    a = model.args
    if (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) != \
            (a.num_layers, a.hidden_size, a.vocab_size):
        raise ValueError(f"{path}: {cfg['num_hidden_layers']} layers of width "
                         f"{cfg['hidden_size']} over {cfg['vocab_size']} tokens, not a "
                         f"{a.num_layers}-layer cut of this target")
    state = {k: torch.tensor(v) for k, v in convert_weights(reader, cfg).items()
             if k.startswith("model.layers.") or k == "model.norm.weight"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"model.embed_tokens.weight", "lm_head.weight"}:
        raise ValueError(f"{path}: tensors do not match the cut: {unexpected or missing}")


@torch.no_grad()
def _match_logit_scale(full: Transformer, cut: Transformer, n: int = 256, seed: int = 0) -> None:
    """Scale the cut model's final norm so its logits spread as the target's do: the norm
    was tuned for the last layer's output, and after the first few layers it gives logits
    about twice as wide (in standard deviation), a confidently wrong start."""
    x = torch.randint(100, full.args.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    ratio = full.causal_logits(x).std() / cut.causal_logits(x).std()
    cut.model.norm.weight.mul_(ratio)


def render_messages(template: str, messages: list[dict]) -> str:
    """A whole conversation under the chat template (no generation prompt)."""
    return _compiled(template).render(messages=messages, add_generation_prompt=False,
                                      bos_token="", eos_token="")


def topk_rows(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits [T, V] -> top-k ids [T, k] uint16, probabilities renormalised over the k
    [T, k] float16 (as smollm2_corpus.topk_probs)."""
    vals, ids = torch.topk(logits.float(), k, dim=-1)
    p = torch.softmax(vals, dim=-1)
    return ids.cpu().numpy().astype(np.uint16), p.cpu().numpy().astype(np.float16)


def _tokenized(tok, template: str, chats, max_len: int):
    """(chat index, ids) of each conversation rendered and cut to max_len tokens (at least
    16, so a chunk carries real text)."""
    for chat in chats:
        msgs = [m for m in chat.messages if m["role"] in ("user", "assistant")][:6]
        ids = tok.tokenize(render_messages(template, msgs))[:max_len]
        if len(ids) >= 16:
            yield ids


def score_corpus(target_dir: Path, tok, chats, max_len: int, k: int, out: Path,
                 device: torch.device, deadline: float = float("inf"), per_chunk: int = 64,
                 batch_tokens: int = 4096) -> Path:
    """Teacher-force `chats` (sharegpt.Chat) through the target; chunk-NNNNN.npz files of
    `per_chunk` conversations in `out`, written atomically (a rerun resumes after the last
    whole chunk). No chunk starts after `deadline` (time.time())."""
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(target_dir, dtype=fast_dtype(device), device=device)
    log.info("scored: torch target, %s on %s", model.dtype, device)
    template = tok.chat_template()
    seqs = _tokenized(tok, template, chats, max_len)
    t0, n_tok, c = time.time(), 0, 0
    while time.time() < deadline:
        part = [s for _, s in zip(range(per_chunk), seqs)]
        if not part:
            break
        path = out / f"chunk-{c:05d}.npz"
        c += 1
        if path.is_file():
            continue
        tops = _score(model, part, k, batch_tokens)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, ids=np.concatenate([np.array(s, np.int32) for s in part]),
                 lengths=np.array([len(s) for s in part], np.int32),
                 n_prompt=np.zeros(len(part), np.int32),
                 temperature=np.full(len(part), -1.0, np.float32),
                 top_ids=np.concatenate([t[0] for t in tops]),
                 top_p=np.concatenate([t[1] for t in tops]))
        tmp.replace(path)
        n_tok += sum(map(len, part))
        log.info("scored: %d chunks, %d tokens this run, %.0f tok/s", c, n_tok,
                 n_tok / (time.time() - t0))
    return out


@torch.inference_mode()
def _score(model: Transformer, seqs: list[list[int]], k: int, batch_tokens: int):
    """Per sequence: top-k after every position but the last."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    res: list = [None] * len(seqs)
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= batch_tokens:
            j += 1
        group = order[i:j]
        width = len(seqs[group[-1]])
        x = torch.full((len(group), width), 2, dtype=torch.long)  # right padding never seen
        for r, g in enumerate(group):
            x[r, :len(seqs[g])] = torch.tensor(seqs[g])
        logits = model.causal_logits(x.to(model.device))
        for r, g in enumerate(group):
            res[g] = topk_rows(logits[r, :len(seqs[g]) - 1], k)
        i = j
    return res
