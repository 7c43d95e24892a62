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
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer as HFTok

from acespec.cloud.target.config import ModelArgs
from acespec.cloud.target.model import Transformer
from acespec.models.card import write_card
from acespec.models.corpus import load_corpus
from acespec.models.demo_pair import (
    PRESETS,
    BuildPreset,
    measure_acceptance,
    model_args,
    token_stream,
)
from acespec.models.distill import train_distilled
from acespec.models.export_hf import export_hf
from acespec.models.gguf_export import export_gguf
from acespec.models.tokenizer_train import save_tokenizer, train_bpe
from acespec.models.train import TrainConfig, evaluate, train
from acespec.shared.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def _train_worker(which: str, args: ModelArgs, cfg: TrainConfig, stream_path: str,
                  ckpt: str, teacher: tuple | None = None) -> dict:
    """Runs in its own process (one core): trains and returns the state dict as numpy.
    teacher = (target args, target state, top_k, pool_every) trains by distillation."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    stream = np.load(stream_path, mmap_mode="r")
    if teacher is None:
        model = train(args, cfg, stream, Path(ckpt), label=which)
    else:
        t_args, t_state, k, pool_every = teacher
        target = Transformer(t_args)
        target.load_state_dict({n: torch.from_numpy(v) for n, v in t_state.items()})
        model = train_distilled(args, cfg, target.eval(), stream, Path(ckpt).parent, k,
                                pool_every, label=which)
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def build_demo(out: Path, work: Path, preset_name: str = "demo", seed: int = 0) -> dict:
    """Run every stage; returns the card's figures (also written to out/build.json)."""
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
    write_card(out, card)
    return card
