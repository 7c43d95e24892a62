"""Drafter objective comparison: next-token cross-entropy vs distillation from the target.

Distillation here is KL to the target's next-token distribution, made cheap by running the
target once over a pool of training windows and caching its top-k log-probabilities; the
drafter then trains on that pool (cycled) with the cross-entropy to the renormalised top-k
distribution as its loss. Both objectives get the same wall time: the distillation arm pays
for its cache out of its step budget. `compare_objectives` trains both from the same
initialisation and measures what matters, greedy acceptance against the target.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer as HFTok

from acespec.cloud.target.loader import load_model
from acespec.models.corpus import load_corpus
from acespec.models.demo_pair import PRESETS, measure_acceptance, model_args, token_stream
from acespec.models.gguf_export import export_gguf
from acespec.models.train import TrainConfig, batch_at, evaluate, train

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeacherCache:
    windows: torch.Tensor  # [n, batch, seq_len + 1] int64
    ids: torch.Tensor  # [n, batch, seq_len, k] int16 the target's top-k next tokens
    logp: torch.Tensor  # [n, batch, seq_len, k] float16 their log-probabilities

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save({"windows": self.windows, "ids": self.ids, "logp": self.logp}, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> TeacherCache:
        d = torch.load(path)
        return cls(d["windows"], d["ids"], d["logp"])


def cache_teacher(target, stream: np.ndarray, cfg: TrainConfig, n: int, k: int) -> TeacherCache:
    """Run the target once over n training batches; keep its top-k log-probs per position."""
    torch.set_num_threads(cfg.threads)
    wins, ids, logp = [], [], []
    with torch.no_grad():
        for i in range(n):
            x = batch_at(stream, replace(cfg, seed=cfg.seed + 7919), i)  # [B, T + 1]
            lp = torch.log_softmax(target.causal_logits(x[:, :-1]).float(), dim=-1)
            top = lp.topk(k, dim=-1)
            wins.append(x)
            ids.append(top.indices.to(torch.int16))  # vocabularies here are < 32768
            logp.append(top.values.to(torch.float16))
            if (i + 1) % 25 == 0:
                log.info("teacher cache: %d/%d batches", i + 1, n)
    return TeacherCache(torch.stack(wins), torch.stack(ids), torch.stack(logp))


def distill_loss(cache: TeacherCache):
    """loss_fn for acespec.models.train.train: cross-entropy of the drafter to the target's
    renormalised top-k distribution (= KL up to the target's entropy)."""
    def loss(logits: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        i = step % len(cache.windows)
        p = torch.softmax(cache.logp[i].float(), dim=-1)  # [B, T, k]
        lq = torch.log_softmax(logits, dim=-1).gather(-1, cache.ids[i].long())  # [B, T, k]
        return -(p * lq).sum(-1).mean()
    return loss


def train_distilled(args, cfg: TrainConfig, target, stream: np.ndarray, work: Path, k: int,
                    pool_every: int, label: str = "drafter"):
    """The drafter trained by distillation from `target` (teacher cache kept in `work`, so
    an interrupted build resumes without recomputing it)."""
    path = work / f"teacher-k{k}-n{max(1, cfg.steps // pool_every)}.pt"
    if path.is_file():
        cache = TeacherCache.load(path)
    else:
        cache = cache_teacher(target, stream, cfg, max(1, cfg.steps // pool_every), k)
        cache.save(path)
    n = len(cache.windows)
    return train(args, cfg, stream, work / f"{label}-distill.ckpt", label=label,
                 loss_fn=distill_loss(cache), batches=lambda s: cache.windows[s % n])


def compare_objectives(demo: Path, work: Path, steps: int = 600, k: int = 32,
                       pool_every: int = 4, seed: int = 1) -> dict:
    """Train the demo drafter shape for `steps` steps' worth of time with each objective and
    measure greedy acceptance (Q8_0 GGUF vs the torch target) and validation perplexity."""
    preset = PRESETS["demo"]
    work.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus(seed=0)
    target_dir = demo / "target"
    streams = {}
    for split, files in (("train", corpus.train), ("valid", corpus.valid)):
        path = work / f"{split}.npy"
        if not path.is_file():
            np.save(path, token_stream(HFTok.from_file(str(target_dir / "tokenizer.json")),
                                       corpus, files))
        streams[split] = np.load(path, mmap_mode="r")
    args = model_args(preset, "drafter")
    cfg = replace(preset.drafter_train, steps=steps, seed=seed, warmup=max(10, steps // 50),
                  ckpt_every=max(50, steps // 10))
    result = {"steps_budget": steps, "top_k": k, "seed": seed, "arms": {}}

    t0 = time.time()
    ce = train(args, cfg, streams["train"], work / "ce.ckpt", label="drafter-ce")
    ce_s = time.time() - t0
    step_s = ce_s / steps

    t0 = time.time()
    target = load_model(target_dir, dtype=torch.float32)
    n_pool = max(1, steps // pool_every)
    cache = cache_teacher(target, streams["train"], cfg, n_pool, k)
    cache_s = time.time() - t0
    kl_steps = max(1, steps - round(cache_s / step_s))  # same wall time as the CE arm
    kl_cfg = replace(cfg, steps=kl_steps, warmup=max(10, kl_steps // 50))
    t0 = time.time()
    kl = train(args, kl_cfg, streams["train"], work / "kl.ckpt", label="drafter-kl",
               loss_fn=distill_loss(cache), batches=lambda s: cache.windows[s % n_pool])
    kl_s = time.time() - t0

    eval_preset = replace(preset, eval_prompts=16, eval_tokens=64, depths=(4, 8))
    for name, model, secs, n in (("cross_entropy", ce, ce_s, steps),
                                 ("distillation", kl, cache_s + kl_s, kl_steps)):
        gguf = work / f"{name}-q8_0.gguf"
        export_gguf(model, target_dir, gguf, ftype="q8_0", name=f"compare-{name}")
        acc = measure_acceptance(target_dir, gguf, corpus, eval_preset, seed=0)
        ppl = math.exp(evaluate(model, streams["valid"], cfg.seq_len))
        result["arms"][name] = {"train_steps": n, "seconds": round(secs, 1),
                                "valid_perplexity": round(ppl, 2), "greedy_acceptance": acc}
        log.info("%s: %d steps in %.0f s, ppl %.2f, acceptance %s", name, n, secs, ppl, acc)
    result["teacher_cache"] = {"batches": n_pool, "seconds": round(cache_s, 1)}
    arms = result["arms"]
    result["winner"] = max(arms, key=lambda a: arms[a]["greedy_acceptance"]["8"])
    (work / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
