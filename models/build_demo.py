"""Build the demo pair: tokenizer, target (HF checkpoint) and drafter (GGUF), with a card.

Stages, each skipped when its output exists (so an interrupted build resumes):
corpus -> BPE tokenizer -> token streams -> target and drafter trained side by side, one
core each (both checkpointed) -> exports -> validation perplexity and greedy acceptance ->
model card. Deterministic given the seed and the Python version (the corpus).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from acespec.cloud.target.config import ModelArgs
from acespec.models.corpus import Corpus, load_corpus
from acespec.models.train import TrainConfig

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


def _train_worker(which: str, args: ModelArgs, cfg: TrainConfig, stream_path: str,
                  ckpt: str, teacher: tuple | None = None) -> dict:
    """Runs in its own process (one core): trains and returns the state dict as numpy.
    teacher = (target args, target state, top_k, pool_every) trains by distillation."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    import torch

    from acespec.models.train import train

    stream = np.load(stream_path, mmap_mode="r")
    if teacher is None:
        model = train(args, cfg, stream, Path(ckpt), label=which)
    else:
        from acespec.cloud.target.model import Transformer
        from acespec.models.distill import train_distilled

        t_args, t_state, k, pool_every = teacher
        target = Transformer(t_args)
        target.load_state_dict({n: torch.from_numpy(v) for n, v in t_state.items()})
        model = train_distilled(args, cfg, target.eval(), stream, Path(ckpt).parent, k,
                                pool_every, label=which)
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def build_demo(out: Path, work: Path, preset_name: str = "demo", seed: int = 0) -> dict:
    """Run every stage; returns the card's figures (also written to out/build.json)."""
    import torch
    from tokenizers import Tokenizer as HFTok

    from acespec.models.tokenizer_train import save_tokenizer, train_bpe

    preset = PRESETS[preset_name]
    preset = replace(preset, target_train=replace(preset.target_train, seed=seed),
                     drafter_train=replace(preset.drafter_train, seed=seed + 1))
    out, work = Path(out), Path(work)
    target_dir = out / "target"
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    corpus = load_corpus(seed=seed, limit=preset.corpus_limit)
    log.info("corpus: %d train / %d validation files (sha256 %s…)", len(corpus.train),
             len(corpus.valid), corpus.sha256[:12])
    if not (target_dir / "tokenizer.json").is_file():
        tok = train_bpe((corpus.read(f) for f in corpus.train), preset.vocab_size)
        save_tokenizer(tok, target_dir)
        log.info("tokenizer: %d tokens", tok.get_vocab_size())
    tok = HFTok.from_file(str(target_dir / "tokenizer.json"))
    streams = {}
    for split, files in (("train", corpus.train), ("valid", corpus.valid)):
        path = work / f"{split}.npy"
        if not path.is_file():
            np.save(path, token_stream(tok, corpus, files))
        streams[split] = path
    n_train = len(np.load(streams["train"], mmap_mode="r"))
    log.info("token streams: %d train tokens", n_train)
    jobs = {w: (model_args(preset, w), preset.target_train if w == "target" else preset.drafter_train)
            for w in ("target", "drafter")}
    states = _train_pair(preset, jobs, str(streams["train"]), work)
    models = {}
    for w, (args, _) in jobs.items():
        from acespec.cloud.target.model import Transformer

        m = Transformer(args)
        m.load_state_dict({k: torch.from_numpy(v) for k, v in states[w].items()})
        models[w] = m.eval()
    train_minutes = (time.time() - t_start) / 60
    return _export_and_measure(out, work, preset, corpus, models, streams, n_train,
                               train_minutes, seed)


def _train_pair(preset: BuildPreset, jobs: dict, stream: str, work: Path) -> dict:
    """Cross-entropy: target and drafter side by side, one core each. Distillation: the
    target first, then the drafter from it (each in its own process, one core)."""
    ctx = mp.get_context("spawn")
    if preset.drafter_objective == "ce":
        with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
            futures = {w: pool.submit(_train_worker, w, a, c, stream, str(work / f"{w}.ckpt"))
                       for w, (a, c) in jobs.items()}
            return {w: f.result() for w, f in futures.items()}
    if preset.drafter_objective != "distill":
        raise ValueError(f"unknown drafter objective {preset.drafter_objective!r}")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        t_args, t_cfg = jobs["target"]
        target = pool.submit(_train_worker, "target", t_args, t_cfg, stream,
                             str(work / "target.ckpt")).result()
        d_args, d_cfg = jobs["drafter"]
        teacher = (t_args, target, preset.distill_top_k, preset.distill_pool_every)
        drafter = pool.submit(_train_worker, "drafter", d_args, d_cfg, stream,
                              str(work / "drafter.ckpt"), teacher).result()
    return {"target": target, "drafter": drafter}


def _export_and_measure(out, work, preset, corpus, models, streams, n_train, train_minutes,
                        seed) -> dict:
    from acespec.models.export_hf import export_hf
    from acespec.models.gguf_export import export_gguf
    from acespec.models.train import evaluate
    from acespec.shared.tokenizer import Tokenizer

    target_dir = out / "target"
    tok = Tokenizer.load(target_dir)
    export_hf(models["target"], target_dir, target_dir, tok.bos_id, tok.eos_id)
    for ft in ("f16", "q8_0"):
        export_gguf(models["drafter"], target_dir, out / f"drafter-{ft}.gguf", ftype=ft,
                    name="acespec-demo-drafter")
    valid = np.load(streams["valid"], mmap_mode="r")
    seq_len = preset.target_train.seq_len
    ppl = {w: math.exp(evaluate(m, valid, seq_len)) for w, m in models.items()}
    params = {w: sum(p.numel() for p in m.parameters()) for w, m in models.items()}
    acc = measure_acceptance(target_dir, out / "drafter-q8_0.gguf", corpus, preset, seed)
    card = {"preset": asdict(preset), "seed": seed, "corpus": corpus.card(),
            "train_tokens_in_corpus": n_train, "params": params, "valid_perplexity": ppl,
            "greedy_acceptance": acc, "build_minutes": round(train_minutes, 1)}
    (out / "build.json").write_text(json.dumps(card, indent=2) + "\n")
    from acespec.models.card import write_card

    write_card(out, card)
    return card


def measure_acceptance(target_dir: Path, gguf: Path, corpus: Corpus, preset: BuildPreset,
                       seed: int) -> dict:
    """Greedy tokens per target step (bonus included) at each depth, on held-out files:
    prompts of 64 tokens from the validation files, eval_tokens generated each."""
    from acespec.cloud.target.loader import load_model
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
    from acespec.shared.config import SamplingParams
    from acespec.shared.tokenizer import Tokenizer
    from acespec.sim.local import generate_local

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
