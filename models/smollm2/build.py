"""The SmolLM2-135M-Instruct drafter: the target's own first layers, distilled on ShareGPT.

The drafter is the target cut after its first `layers` of 30 decoder layers (its own
embedding, final norm and tied head kept), so it starts where the target's own computation
starts; the layers and the final norm are then trained to predict the target's
next-token distribution (embedding and head frozen: they are the target's).

Stages, each skipped when its output exists (an interrupted build resumes by chunk/step):
  answers  the target's own answers (the torch target, bfloat16 where the device has it,
           64 chats side by side) to first user turns of the ShareGPT *training* split, its
           top-k kept at every position (what acceptance is measured on: the target's
           answers);
  scored   ShareGPT training conversations as written, teacher-forced through the torch
           target (a parallel prefill: far cheaper per token than generating), top-k kept;
  eval     the target's greedy answers to prompts of the *evaluation* split, balanced over
           categories (only `measure` reads them);
  train    distillation on answers + scored (sampled softmax over the teacher's top-k plus
           uniform negatives), checkpointed; CUDA when present, else the CPU;
  export   GGUF F16 and Q8_0 with the target's tokenizer metadata copied;
  measure  greedy acceptance of the Q8_0 drafter against the eval answers, per category.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
from acespec.models import sharegpt
from acespec.models.gguf_export import export_gguf
from acespec.models.smollm2 import fetch
from acespec.models.smollm2.answers import TorchBatch
from acespec.models.smollm2.card import write_card
from acespec.models.smollm2.corpus import LlamaBatch, generate_corpus, load_chunks
from acespec.models.smollm2.distill import Batches, TeacherData
from acespec.models.smollm2.teacher import cut_target, grow, score_corpus, start_from_gguf
from acespec.models.train import TrainConfig, train

log = logging.getLogger(__name__)
DONE = ".done"  # a corpus stage that ran its course (budget spent or prompts used up)


@dataclass(frozen=True)
class ExitPreset:
    layers: int  # decoder layers kept from the target (its first ones)
    train: TrainConfig
    n_answer_prompts: int = 6000  # training-split prompts offered to the answer stage
    answer_minutes: float = 20.0  # time budget of the answer stage (this run)
    scored_minutes: float = 20.0  # time budget of the teacher-forced stage (this run)
    scored_len: int = 512  # tokens per teacher-forced conversation at most
    n_scored: int = 12_000  # training-split conversations offered to the scored stage
    max_prompt_chars: int = 1500
    max_new: int = 128
    greedy_frac: float = 0.7
    temperature: float = 0.7
    top_k: int = 32
    eval_per_category: int = 10
    eval_new: int = 128
    depths: tuple[int, ...] = (2, 4, 8)
    n_seq: int = 16  # chats decoded side by side (answers: torch; eval: llama.cpp)
    ckpt: str = "drafter.ckpt"  # the training checkpoint's name in the work folder
    grow_from: str | None = None  # a shallower preset this one starts from (see grow)
    # A drafter GGUF of the same depth, in this package's folder, whose layers and norm the
    # training starts from (a shipped drafter trained on; see teacher.start_from_gguf).
    start_gguf: str | None = None


PRESETS = {
    "smollm2": ExitPreset(
        layers=6,
        answer_minutes=55.0,
        train=TrainConfig(steps=720, batch=8, seq_len=512, lr=5e-4, min_lr_frac=0.1, warmup=15,
                          weight_decay=0.0, ckpt_every=20, log_every=5)),
    # The trained 6 layers and 2 more (the target's 7th and 8th, added as no-ops), trained on.
    "smollm2-8": ExitPreset(
        layers=8, ckpt="drafter-8.ckpt", grow_from="smollm2",
        train=TrainConfig(steps=400, batch=8, seq_len=512, lr=3e-4, min_lr_frac=0.1, warmup=10,
                          weight_decay=0.0, ckpt_every=10, log_every=5)),
    # The shipped 8-layer drafter trained on with fresh material: the target's answers to
    # other training-split prompts (build with --seed 1) and bfloat16 autocast.
    "smollm2-8c": ExitPreset(
        layers=8, ckpt="drafter-8c.ckpt", start_gguf="drafter-q8_0.gguf",
        answer_minutes=25.0, scored_minutes=10.0, n_seq=64,
        train=TrainConfig(steps=360, batch=8, seq_len=512, lr=2e-4, min_lr_frac=0.1, warmup=10,
                          weight_decay=0.0, ckpt_every=10, log_every=5, autocast=True)),
    # Seconds: every stage on a handful of chats (for the test).
    "tiny": ExitPreset(
        layers=1, train=TrainConfig(steps=4, batch=2, seq_len=64, warmup=1, ckpt_every=2,
                                    log_every=2),
        n_answer_prompts=4, answer_minutes=5, scored_minutes=5, scored_len=64, n_scored=8,
        max_new=8,
        eval_per_category=1, eval_new=8, depths=(2,), n_seq=4),
}
PRESETS["tiny-2"] = replace(PRESETS["tiny"], layers=2, ckpt="drafter-2.ckpt", grow_from="tiny")
HERE = Path(__file__).parent  # the shipped drafter's folder


def _device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_answers(target_dir: Path, target_gguf: Path, work: Path, preset: ExitPreset, seed: int,
                  minutes: float | None = None) -> Path:
    """work/answers: the target's answers to training-split prompts (resumable by chunk)."""
    if (work / "answers" / DONE).is_file():
        return work / "answers"
    chats = [c for c in sharegpt.records("train") if sharegpt.is_english(c.first_user)
             and len(c.first_user) <= preset.max_prompt_chars]
    order = np.random.default_rng([seed, 3]).permutation(len(chats))[:preset.n_answer_prompts]
    texts = [chats[i].first_user for i in order]
    torch.set_num_threads(preset.train.threads)  # 1 by default: the other corpus stage beside
    tok = LlamaBatch(target_gguf, n_seq=1, n_ctx_seq=64)
    model = TorchBatch(target_dir, tok, n_seq=preset.n_seq, n_ctx_seq=512 + preset.max_new,
                       device=_device())
    minutes = preset.answer_minutes if minutes is None else minutes
    try:
        generate_corpus(model, texts, preset.max_new, preset.greedy_frac, preset.temperature,
                        preset.top_k, seed, work / "answers", chunk=preset.n_seq,
                        deadline=time.time() + minutes * 60)
    finally:
        tok.close()
    (work / "answers" / DONE).touch()
    return work / "answers"


def build_eval(target_gguf: Path, work: Path, preset: ExitPreset, seed: int) -> Path:
    """work/eval: greedy target answers to evaluation-split prompts, per category."""
    done = work / "eval" / "categories.json"
    if done.is_file():
        return done.parent
    chats = sharegpt.prompts_by_category(sharegpt.records("eval"), preset.eval_per_category,
                                         max_chars=preset.max_prompt_chars)
    model = LlamaBatch(target_gguf, n_seq=preset.n_seq, n_ctx_seq=512 + preset.eval_new)
    try:
        kept = [chats[i] for i in generate_corpus(
            model, [c.first_user for c in chats], preset.eval_new, 1.0, 0.0, preset.top_k, seed,
            work / "eval", chunk=10_000)]
    finally:
        model.close()
    done.write_text(json.dumps([{"index": c.index, "category": c.category} for c in kept]))
    return done.parent


def build_scored(target_dir: Path, target_gguf: Path, work: Path, preset: ExitPreset, seed: int,
                 minutes: float | None = None) -> Path:
    """work/scored: training-split conversations teacher-forced through the torch target."""
    if (work / "scored" / DONE).is_file():
        return work / "scored"
    torch.set_num_threads(preset.train.threads)  # 1 by default: the other corpus stage beside
    chats = sharegpt.records("train")
    order = np.random.default_rng([seed, 5]).permutation(len(chats))[:preset.n_scored]
    tok = LlamaBatch(target_gguf, n_seq=1, n_ctx_seq=64)
    try:
        score_corpus(target_dir, tok, [chats[i] for i in order], preset.scored_len,
                     preset.top_k, work / "scored", _device(), per_chunk=min(64, len(order)),
                     deadline=time.time() + 60 * (preset.scored_minutes
                                                  if minutes is None else minutes))
    finally:
        tok.close()
    (work / "scored" / DONE).touch()
    return work / "scored"


def train_drafter(target_dir: Path, work: Path, preset: ExitPreset, seed: int):
    """The drafter (acespec.cloud.target.model.Transformer), trained or resumed from work/; a
    preset grown from another starts from that one's trained drafter (trained first if its
    checkpoint is missing)."""
    # A grown preset needs its base only to start: once its own checkpoint exists it resumes.
    starting = preset.grow_from is not None and not (work / preset.ckpt).is_file()
    base = PRESETS[preset.grow_from] if starting else None
    start = None if base is None else _finished_state(work / base.ckpt)
    if base is not None and start is None:
        log.info("growing from preset %r: training it first", preset.grow_from)
        start = train_drafter(target_dir, work, base, seed).state_dict()
    parts = [load_chunks(work / d) for d in ("answers", "scored") if any((work / d).glob("chunk-*"))]
    teacher = TeacherData.from_chunks({k: np.concatenate([p[k] for p in parts])
                                       for k in ("ids", "lengths", "n_prompt", "top_ids", "top_p")})
    cfg, device = replace(preset.train, seed=seed), _device()
    torch.set_num_threads(cfg.threads)
    model = cut_target(target_dir, preset.layers)
    if preset.start_gguf and not (work / preset.ckpt).is_file():
        start_from_gguf(model, _start_copy(work, preset))
        log.info("%d layers and the final norm from %s", preset.layers, preset.start_gguf)
    if base is not None:
        grow(model, start)
        log.info("%d layers: the first %d and the final norm from %s, the rest added as no-ops",
                 preset.layers, base.layers, base.ckpt)
    model = model.to(device)
    model.model.embed_tokens.weight.requires_grad_(False)  # tied head: the target's own
    batches = Batches(teacher, cfg, device=device)
    log.info("training on %s: %d sequences, %d tokens (%d answer tokens), %d batches per epoch",
             device, len(teacher.lengths), len(teacher.ids),
             int((teacher.lengths - teacher.n_prompt).sum()), len(batches.buckets))
    return train(model.args, cfg, np.zeros(8, np.uint16), work / preset.ckpt, label="drafter",
                 loss_fn=batches.loss, batches=batches, model=model, forward=batches.forward)


def greedy_steps(drafter, seq: list[int], n_prompt: int, depth: int) -> tuple[int, int]:
    """(tokens emitted, target steps) when `drafter` (an acespec LlamaDrafter) drafts `depth`
    tokens greedily and the target's greedy answer `seq[n_prompt:]` decides; a step emits
    its accepted drafts plus the bonus/recovered token, the last one only the tokens the
    answer has left."""
    steps = emitted = 0
    pos = n_prompt
    while pos < len(seq):
        draft, ctx = [], seq[:pos]
        for _ in range(depth):
            draft.append(int(np.argmax(drafter.next_logits(ctx + draft))))
        accepted = 0
        while accepted < depth and pos + accepted < len(seq) and \
                draft[accepted] == seq[pos + accepted]:
            accepted += 1
        steps += 1
        emitted += min(accepted + 1, len(seq) - pos)
        pos += accepted + 1
    drafter.drop(0)
    return emitted, steps


def measure(gguf_path: Path, work: Path, depths: tuple[int, ...]) -> dict:
    """{category or "all": {depth: tokens per target step, "chats": n}} on the eval answers
    (each chat drafted once per depth; a category's figure is its chats' tokens over their
    steps)."""
    chats = load_chunks(work / "eval")
    cats = [c["category"] for c in json.loads((work / "eval" / "categories.json").read_text())]
    drafter = LlamaDrafter(gguf_path, LlamaDrafterConfig(n_ctx=1024, n_seq_max=1, n_threads=1))
    offsets = np.concatenate([[0], np.cumsum(chats["lengths"])])
    try:
        counts = np.array([[greedy_steps(drafter, chats["ids"][offsets[i]:offsets[i + 1]].tolist(),
                                         int(n), d) for d in depths]
                           for i, n in enumerate(chats["n_prompt"])])  # [chat, depth, 2]
    finally:
        drafter.close()
    out: dict[str, dict[str, float]] = {}
    for cat in [*sorted(set(cats)), "all"]:
        rows = [i for i, c in enumerate(cats) if cat in ("all", c)]
        total = counts[rows].sum(0)  # [depth, 2]
        out[cat] = {str(d): round(float(e / s), 3) for d, (e, s) in zip(depths, total)}
        out[cat]["chats"] = len(rows)
        log.info("%s %s: %s", gguf_path.name, cat, out[cat])
    return out


def agreement(gguf_path: Path, work: Path) -> dict[str, float]:
    """{category or "all": the fraction of answer positions of the eval chats where the
    drafter's top-1, teacher-forced on the target's greedy answer, is the answer's token}."""
    chats = load_chunks(work / "eval")
    cats = [c["category"] for c in json.loads((work / "eval" / "categories.json").read_text())]
    offsets = np.concatenate([[0], np.cumsum(chats["lengths"])])
    model = LlamaBatch(gguf_path, n_seq=1, n_ctx_seq=int(chats["lengths"].max()))
    hits = []  # per chat: (agreeing positions, answer positions)
    try:
        for i, n in enumerate(chats["n_prompt"]):
            seq = chats["ids"][offsets[i]:offsets[i + 1]]
            top, _ = model.topk(seq[:-1].tolist(), 1)  # [len - 1, 1]: after each position
            same = top[n - 1:, 0].astype(np.int64) == seq[n:]
            hits.append((int(same.sum()), len(same)))
    finally:
        model.close()
    out = {}
    for cat in [*sorted(set(cats)), "all"]:
        agree, total = np.array([hits[i] for i, c in enumerate(cats) if cat in ("all", c)]).sum(0)
        out[cat] = round(float(agree / max(1, total)), 3)
    return out


def build(target_dir: Path, target_gguf: Path, out: Path, work: Path,
          preset_name: str = "smollm2", seed: int = 0, threads: int | None = None) -> dict:
    """Every stage; returns the card's figures (also out/build.json and out/README.md)."""
    preset = PRESETS[preset_name]
    if threads:
        preset = replace(preset, train=replace(preset.train, threads=threads))
    out, work = Path(out), Path(work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    _timed(work, "eval", lambda: build_eval(target_gguf, work, preset, seed))
    _timed(work, "answers", lambda: build_answers(target_dir, target_gguf, work, preset, seed))
    _timed(work, "scored", lambda: build_scored(target_dir, target_gguf, work, preset, seed))
    model = _timed(work, f"train {preset_name}",
                   lambda: train_drafter(target_dir, work, preset, seed)).cpu()
    files = {ft: export_gguf(model, None, out / f"drafter-{ft}.gguf", ftype=ft,
                             name="acespec-smollm2-drafter", context_length=8192,
                             tokenizer_gguf=target_gguf) for ft in ("f16", "q8_0")}
    t0 = time.time()
    acc = measure(files["q8_0"], work, preset.depths)
    agree = agreement(files["q8_0"], work)
    corpus = {d: load_chunks(work / d) for d in ("answers", "scored")}
    card = {
        "kind": "exit", "preset": preset_name, "seed": seed, "layers": preset.layers,
        "drafter": asdict(model.args), "train": asdict(replace(preset.train, seed=seed)),
        "train_sittings": _sittings(work / preset.ckpt), "grown_from": preset.grow_from,
        "started_from": None if preset.start_gguf is None else {
            "file": preset.start_gguf,
            "sha256": hashlib.sha256(_start_copy(work, preset).read_bytes()).hexdigest()},
        "params": sum(p.numel() for p in model.parameters()),
        "trained_params": sum(p.numel() for n, p in model.named_parameters()
                              if "embed_tokens" not in n),
        "corpus": {d: {"sequences": int(len(c["lengths"])), "tokens": int(len(c["ids"]))}
                   for d, c in corpus.items()},
        "top_k": preset.top_k, "eval_new_tokens": preset.eval_new,
        "greedy_acceptance": acc, "agreement": agree,
        "minutes": {**json.loads((work / "times.json").read_text()),
                    "measure": round((time.time() - t0) / 60, 1)},
        "files": {ft: {"name": p.name, "bytes": p.stat().st_size} for ft, p in files.items()},
    }
    (out / "build.json").write_text(json.dumps(card, indent=2) + "\n")
    write_card(out, card)
    return card


def _start_copy(work: Path, preset: ExitPreset) -> Path:
    """The preset's start GGUF, copied into work/ on first use: the export may overwrite the
    shipped file it names, and the card reports what the training really started from."""
    copy = work / f"start-{Path(preset.start_gguf).name}"
    if not copy.is_file():
        shutil.copyfile(HERE / preset.start_gguf, copy.with_suffix(".tmp"))
        copy.with_suffix(".tmp").replace(copy)
    return copy


def _finished_state(ckpt: Path) -> dict | None:
    """The model state of a checkpoint that ran all the steps its config asked for (None if
    there is none, or it stopped short)."""
    if not ckpt.is_file():
        return None
    state = torch.load(ckpt, weights_only=False, map_location="cpu")
    return state["model"] if state["step"] >= state["config"]["steps"] else None


def _sittings(ckpt: Path) -> list[int]:
    """The step counts the training was asked for, sitting by sitting ([steps] when one)."""
    state = torch.load(ckpt, weights_only=False, map_location="cpu")
    return list(state.get("sittings", [state["config"]["steps"]]))


def _timed(work: Path, name: str, fn):
    """Run a stage and record its minutes in work/times.json (added up over sittings)."""
    path = work / "times.json"
    t0 = time.time()
    result = fn()
    times = json.loads(path.read_text()) if path.is_file() else {}
    times[name] = round(times.get(name, 0) + (time.time() - t0) / 60, 1)
    path.write_text(json.dumps(times))
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["eval", "answers", "scored", "train", "all"])
    p.add_argument("--out", default="models/smollm2")
    p.add_argument("--work", default="runs/build-smollm2-drafter")
    p.add_argument("--preset", default="smollm2-8", choices=sorted(PRESETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, help="this run's budget for answers/scored")
    p.add_argument("--threads", type=int, help="torch threads (default: the preset's)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    paths, preset, work = fetch(), PRESETS[a.preset], Path(a.work)
    if a.threads:  # how fast, not what is built: a checkpoint resumes under another count
        preset = replace(preset, train=replace(preset.train, threads=a.threads))
    work.mkdir(parents=True, exist_ok=True)
    if a.stage == "eval":
        _timed(work, "eval", lambda: build_eval(paths["gguf"], work, preset, a.seed))
    elif a.stage == "answers":
        _timed(work, "answers", lambda: build_answers(paths["target"], paths["gguf"], work, preset,
                                                     a.seed, a.minutes))
    elif a.stage == "scored":
        _timed(work, "scored", lambda: build_scored(paths["target"], paths["gguf"], work, preset,
                                                    a.seed, a.minutes))
    elif a.stage == "train":
        _timed(work, f"train {a.preset}",
               lambda: train_drafter(paths["target"], work, preset, a.seed))
    else:
        print(json.dumps(build(paths["target"], paths["gguf"], Path(a.out), work, a.preset,
                               a.seed, a.threads)["greedy_acceptance"]))


if __name__ == "__main__":
    main()
