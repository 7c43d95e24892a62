"""The demo pair's recipe: the presets of its two models (shapes and training), the token
streams they train on, and the greedy acceptance that measures them. acespec.models.build_demo
builds the pair from it; acespec.models.distill compares drafter objectives on it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from acespec.cloud.target.config import ModelArgs
from acespec.cloud.target.loader import load_model
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
from acespec.models.corpus import Corpus
from acespec.models.train import TrainConfig
from acespec.shared.config import SamplingParams
from acespec.shared.tokenizer import Tokenizer
from acespec.sim.local import generate_local

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildPreset:
    vocab_size: int
    target: dict  # ModelArgs fields besides arch/vocab
    drafter: dict
    target_train: TrainConfig
    drafter_train: TrainConfig
    corpus_limit: int | None = None
    eval_prompts: int = 24
    eval_tokens: int = 96
    depths: tuple[int, ...] = (2, 4, 8)
    # "distill": KL to the trained target's cached top-k (won the equal-time comparison of
    # `acespec models compare-objectives`; see the card); "ce": next-token cross-entropy,
    # trained alongside the target.
    drafter_objective: str = "distill"
    distill_top_k: int = 32
    distill_pool_every: int = 4  # teacher cache: one batch per this many drafter steps
    extra: dict = field(default_factory=dict)


PRESETS = {
    # ~5M-parameter target (~2 h on one core), then a ~1M drafter distilled from it (~50 min).
    "demo": BuildPreset(
        vocab_size=4096,
        target=dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
                    num_kv_heads=2, head_dim=32, tie_word_embeddings=False),
        drafter=dict(hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=32, tie_word_embeddings=True),
        target_train=TrainConfig(steps=3200, batch=16, seq_len=256, lr=2e-3, warmup=100),
        drafter_train=TrainConfig(steps=5000, batch=16, seq_len=256, lr=3e-3, warmup=100)),
    # Seconds: exercises every stage in CI.
    "tiny": BuildPreset(
        vocab_size=300,
        target=dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, tie_word_embeddings=False),
        drafter=dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=16, tie_word_embeddings=True),
        target_train=TrainConfig(steps=30, batch=4, seq_len=64, warmup=5, ckpt_every=10, log_every=10),
        drafter_train=TrainConfig(steps=30, batch=4, seq_len=64, warmup=5, ckpt_every=10, log_every=10),
        corpus_limit=30, eval_prompts=3, eval_tokens=16),
}


def model_args(preset: BuildPreset, which: str) -> ModelArgs:
    dims = preset.target if which == "target" else preset.drafter
    return ModelArgs(arch="llama", vocab_size=preset.vocab_size, rms_norm_eps=1e-5,
                     rope_theta=10000.0, max_position_embeddings=4096, **dims)


def token_stream(tok, corpus: Corpus, files: list[str]) -> np.ndarray:
    """[n_tokens] uint16: BOS + file + EOS for each file, concatenated in list order."""
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    encs = tok.encode_batch([corpus.read(f) for f in files], add_special_tokens=False)
    return np.concatenate([np.array([bos, *e.ids, eos], dtype=np.uint16) for e in encs])


def measure_acceptance(target_dir: Path, gguf: Path, corpus: Corpus, preset: BuildPreset,
                       seed: int) -> dict:
    """Greedy tokens per target step (bonus included) at each depth, on held-out files:
    prompts of 64 tokens from the validation files, eval_tokens generated each."""
    tok = Tokenizer.load(target_dir)
    target = load_model(target_dir)
    drafter = LlamaDrafter(gguf, LlamaDrafterConfig(n_ctx=1024, n_seq_max=1))
    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(preset.eval_prompts):
        ids = tok.encode(corpus.read(corpus.valid[i % len(corpus.valid)]))
        start = int(rng.integers(0, max(1, len(ids) - 64 - preset.eval_tokens)))
        prompts.append(ids[start:start + 64] or ids[:1])
    result = {}
    for depth in preset.depths:
        steps = emitted = 0
        for p in prompts:
            _, stats = generate_local(target, drafter, p, preset.eval_tokens, depth,
                                      SamplingParams())
            steps, emitted = steps + stats.steps, emitted + stats.emitted
        result[str(depth)] = round(emitted / steps, 3)
        log.info("greedy acceptance at depth %d: %.3f tokens per target step", depth, emitted / steps)
    return result
