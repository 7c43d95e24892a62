"""Language-model training on a token stream: seeded, checkpointed, resumable."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from acespec.cloud.target.config import ModelArgs
from acespec.cloud.target.model import Transformer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 1
    ckpt_every: int = 200
    log_every: int = 25
    # Forward and loss under bfloat16 autocast (weights and optimizer stay float32): ~2x on a
    # CPU with native bfloat16, and on CUDA. Off for the demo pair, whose build is pinned.
    autocast: bool = False


def batch_at(stream: np.ndarray, cfg: TrainConfig, step: int) -> torch.Tensor:
    """Windows [batch, seq_len + 1] int64 for `step`: a pure function of (seed, step), so a
    resumed run sees exactly the batches an uninterrupted one would."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(stream) - cfg.seq_len - 1, size=cfg.batch)
    return torch.from_numpy(np.stack([stream[s:s + cfg.seq_len + 1] for s in starts]).astype(np.int64))


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def init_model(args: ModelArgs, seed: int) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(args)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * args.num_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            torch.nn.init.normal_(p, std=std)
    return model


def evaluate(model: Transformer, stream: np.ndarray, seq_len: int, max_windows: int = 64) -> float:
    """Mean next-token cross-entropy (nats) over evenly spaced validation windows."""
    n = min(max_windows, (len(stream) - 1) // seq_len)
    starts = np.linspace(0, len(stream) - seq_len - 1, n).astype(int)
    losses = []
    with torch.no_grad():
        for chunk in np.array_split(starts, max(1, n // 16)):
            x = torch.from_numpy(np.stack([stream[s:s + seq_len + 1] for s in chunk]).astype(np.int64))
            logits = model.causal_logits(x[:, :-1])
            losses.append(F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item())
    return float(np.mean(losses))


def cross_entropy(logits: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
    """Next-token cross-entropy: logits [B, T, V] for windows x [B, T + 1]."""
    return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())


def _resumable(state: dict, cfg: TrainConfig, args: ModelArgs) -> bool:
    """A checkpoint resumes under the same config, or extends a run that asked for fewer
    steps (everything else equal but the thread count and the logging/checkpoint cadence)."""
    free = ("steps", "threads", "ckpt_every", "log_every")  # not what is learned
    old = {"autocast": False, **state["config"]}  # checkpoints from before the field
    same = {k: v for k, v in old.items() if k not in free} == \
        {k: v for k, v in asdict(cfg).items() if k not in free}
    return state["args"] == asdict(args) and same and old["steps"] <= cfg.steps


def train(args: ModelArgs, cfg: TrainConfig, stream: np.ndarray, ckpt: Path,
          label: str = "model", loss_fn=cross_entropy, batches=None,
          model: Transformer | None = None, forward=None) -> Transformer:
    """Train (or resume from `ckpt`) for cfg.steps; returns the model in eval mode.
    loss_fn(logits, x, step) is the objective; batches(step) overrides the windows;
    `model` is the initialised model to start from (default: init_model); forward(model,
    x, step) replaces causal_logits(x[:, :-1]) as what loss_fn receives."""
    torch.set_num_threads(cfg.threads)
    model = init_model(args, cfg.seed) if model is None else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    start, sittings = 0, [cfg.steps]
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if not _resumable(state, cfg, args):
            raise ValueError(f"{ckpt} was written with a different config; delete it to restart")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, sittings = state["step"], state.get("sittings", [state["config"]["steps"]])
        if cfg.steps > state["config"]["steps"]:
            log.info("%s: extending a finished %d-step run to %d steps (the schedule is the "
                     "%d-step one from step %d on)", label, state["config"]["steps"], cfg.steps,
                     cfg.steps, start)
            sittings = [*sittings, cfg.steps]
        log.info("%s: resuming at step %d/%d", label, start, cfg.steps)
    model.train()
    device = next(model.parameters()).device
    t0, tokens = time.time(), 0
    for step in range(start, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        x = batch_at(stream, cfg, step) if batches is None else batches(step)
        with torch.autocast(device.type, torch.bfloat16, enabled=cfg.autocast):
            out = model.causal_logits(x[:, :-1]) if forward is None else forward(model, x, step)
            loss = loss_fn(out, x, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        tokens += x[:, :-1].numel()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            rate = tokens / (time.time() - t0)
            eta = (cfg.steps - step - 1) * x[:, :-1].numel() / rate
            log.info("%s step %d/%d loss %.3f lr %.2e %.0f tok/s eta %.0f min", label, step + 1,
                     cfg.steps, loss.item(), lr_at(cfg, step), rate, eta / 60)
        if (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1,
                        "config": asdict(cfg), "args": asdict(args), "sittings": sittings}, tmp)
            tmp.replace(ckpt)
    return model.eval()
