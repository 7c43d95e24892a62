"""Build a drafter for SmolLM2-135M-Instruct: same tokenizer, ~20M parameters, distilled.

Stages, each skipped when its output exists (an interrupted build resumes):
  corpus   held-out eval prompts answered greedily, then training chats answered by the
           target (llama.cpp, Q4_1 GGUF), its top-k next-token distribution kept at every
           position as the teacher (chunked .npz, resumable by chunk);
  train    a small Llama, embedding initialised from the target's by PCA, trained on the
           teacher's top-k (distillation, at prompt and answer positions) plus next-token
           cross-entropy on standard-library code (free material: no teacher pass),
           sampled softmax, checkpointed;
  export   GGUF F16 and Q8_0 with the target's tokenizer metadata (tokenizer.ggml.*,
           chat template) copied, so llama.cpp tokenizes identically;
  measure  greedy acceptance of the Q8_0 drafter against the target GGUF's greedy answers.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from acespec.cloud.config import ModelArgs
from acespec.models.train import TrainConfig

log = logging.getLogger(__name__)

VOCAB = 49152


@dataclass(frozen=True)
class DrafterPreset:
    drafter: dict  # ModelArgs fields besides arch/vocab
    train: TrainConfig
    n_train_prompts: int = 3000
    n_eval_prompts: int = 24  # per kind (chat, code)
    max_new: int = 128
    eval_new: int = 128
    greedy_frac: float = 0.5
    temperature: float = 0.7
    top_k: int = 32
    corpus_minutes: float = 45.0  # stop generating after this long; train on what exists
    code_ce_frac: float = 0.25  # share of batches that are stdlib code (cross-entropy)
    answer_only: bool = False  # distil at answer positions only (else prompts too)
    max_files: int | None = None  # stdlib files scanned for snippets
    depths: tuple[int, ...] = (2, 4, 8)
    reference: bool = True  # also measure the target GGUF as its own drafter


PRESETS = {
    "smollm2": DrafterPreset(
        drafter=dict(hidden_size=384, intermediate_size=1024, num_layers=4, num_heads=6,
                     num_kv_heads=2, head_dim=64, tie_word_embeddings=True),
        train=TrainConfig(steps=1200, batch=6, seq_len=512, lr=2e-3, warmup=40,
                          ckpt_every=50, log_every=10)),
    # Seconds: every stage on a handful of chats (for the test).
    "tiny": DrafterPreset(
        drafter=dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=32, tie_word_embeddings=True),
        train=TrainConfig(steps=6, batch=2, seq_len=64, warmup=2, ckpt_every=3, log_every=3),
        n_train_prompts=4, n_eval_prompts=1, max_new=8, eval_new=8, corpus_minutes=5,
        max_files=40, depths=(2,), reference=False),
}


def model_args(preset: DrafterPreset) -> ModelArgs:
    return ModelArgs(arch="llama", vocab_size=VOCAB, rms_norm_eps=1e-5, rope_theta=100000.0,
                     max_position_embeddings=8192, **preset.drafter)


def build_corpus(target_gguf: Path, work: Path, preset: DrafterPreset, seed: int,
                 minutes: float | None = None) -> dict:
    """Eval answers (greedy) and training chats with the teacher's top-k, for at most
    `minutes` (default: the preset's) of this run; work/corpus.json marks it done and keeps
    the wall seconds of every run that added to it."""
    from acespec.models.smollm2_corpus import LlamaBatch, generate_corpus
    from acespec.models.smollm2_prompts import build_prompts

    done = work / "corpus.json"
    state = json.loads(done.read_text()) if done.is_file() else {}
    if state.get("done"):
        return state
    minutes = preset.corpus_minutes if minutes is None else minutes
    prompts = build_prompts(preset.n_train_prompts, preset.n_eval_prompts, seed,
                            max_files=preset.max_files)
    model = LlamaBatch(target_gguf, n_seq=16, n_ctx_seq=512 + preset.max_new)
    t0 = time.time()
    for kind in ("eval_chat", "eval_code"):
        generate_corpus(model, [p.text for p in prompts[kind]], preset.eval_new, 1.0, 0.0,
                        preset.top_k, seed, work / kind, chunk=16)
    generate_corpus(model, [p.text for p in prompts["train"]], preset.max_new,
                    preset.greedy_frac, preset.temperature, preset.top_k, seed, work / "train",
                    chunk=32, deadline=t0 + minutes * 60)
    model.close()
    state = {"done": True, "seconds": round(state.get("seconds", 0) + time.time() - t0, 1)}
    done.write_text(json.dumps(state))
    return state


def build_code_stream(target_gguf: Path, work: Path, preset: DrafterPreset, max_tokens: int) -> Path:
    """Standard-library source from files outside the held-out split, tokenized by the
    target's llama.cpp tokenizer: work/code.npy [n] uint16."""
    import sysconfig

    from acespec.models.smollm2_corpus import LlamaBatch
    from acespec.models.smollm2_prompts import _held_out
    from acespec.models.smollm2_train import code_stream

    path = work / "code.npy"
    if path.is_file():
        return path
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts
                   and not _held_out(str(p.relative_to(root)), 0.15))[:preset.max_files]
    files = [files[i] for i in np.random.default_rng(0).permutation(len(files))]
    tok = LlamaBatch(target_gguf, n_seq=1, n_ctx_seq=64)
    stream = code_stream(lambda t: tok.tokenize(t, special=False), files, max_tokens, tok.eos_id)
    tok.close()
    np.save(path, stream)
    return path


def train_drafter(target_gguf: Path, work: Path, preset: DrafterPreset, seed: int):
    """The drafter (acespec.cloud.model.Transformer), trained or resumed from work/."""
    import torch

    from acespec.models.smollm2_corpus import load_chunks
    from acespec.models.smollm2_train import Batches, TeacherData, pca_embedding, target_embedding
    from acespec.models.train import init_model, train

    teacher = TeacherData.from_chunks(load_chunks(work / "train"))
    code = np.load(build_code_stream(target_gguf, work, preset, 4_000_000), mmap_mode="r")
    args, cfg = model_args(preset), replace(preset.train, seed=seed)
    torch.set_num_threads(cfg.threads)
    model = init_model(args, seed)
    with torch.no_grad():  # at init_model's scale: the target's (0.14) gives logits of ~50
        model.model.embed_tokens.weight.copy_(torch.from_numpy(  # for the input token itself
            pca_embedding(target_embedding(target_gguf), args.hidden_size, 0.02)))
    batches = Batches(teacher, code, cfg, preset.code_ce_frac, answer_only=preset.answer_only)
    log.info("training: %d chats (%d tokens, %d answer tokens), %d distillation batches per "
             "epoch, %d code tokens", len(teacher.lengths), len(teacher.ids),
             int((teacher.lengths - teacher.n_prompt).sum()), len(batches.buckets), len(code))
    return train(args, cfg, code, work / "drafter.ckpt", label="drafter", loss_fn=batches.loss,
                 batches=batches, model=model, forward=batches.forward)


def heldout(model, work: Path) -> dict:
    """Teacher-forced figures on the held-out answers, full softmax: distillation loss
    (nats per answer token) and how often the student's top token is the teacher's."""
    import torch

    from acespec.models.smollm2_corpus import load_chunks
    from acespec.models.smollm2_train import TeacherData

    out = {}
    for kind in ("eval_chat", "eval_code"):
        t = TeacherData.from_chunks(load_chunks(work / kind))
        loss = agree = n = 0.0
        for i in range(len(t.lengths)):
            ids = torch.from_numpy(t.ids[t.starts[i]:t.starts[i] + t.lengths[i]].astype(np.int64))
            lo, hi = int(t.n_prompt[i]) - 1, int(t.lengths[i]) - 1  # rows predicting answers
            rows = slice(t.row_starts[i] + lo, t.row_starts[i] + hi)
            top = torch.from_numpy(t.top_ids[rows].astype(np.int64))
            p = torch.from_numpy(t.top_p[rows].astype(np.float32))
            with torch.no_grad():
                lq = torch.log_softmax(model.causal_logits(ids[None, :-1])[0, lo:hi], -1)
            loss += float(-(p * lq.gather(-1, top)).sum())
            agree += float((lq.argmax(-1) == top[:, 0]).sum())
            n += hi - lo
        out[kind.removeprefix("eval_")] = {"distill_loss": round(loss / n, 3),
                                           "top1_agreement": round(agree / n, 3)}
    return out


def greedy_acceptance(drafter, chats: dict[str, np.ndarray], depth: int) -> float:
    """Mean tokens per target step (accepted + the bonus/recovered token) when `drafter`
    (an acespec LlamaDrafter) drafts `depth` tokens greedily and the target's greedy answer
    (chats from generate_corpus, temperature 0) decides; the last step of an answer counts
    only the tokens the answer has left."""
    steps = emitted = 0
    offsets = np.concatenate([[0], np.cumsum(chats["lengths"])])
    for i, n_prompt in enumerate(chats["n_prompt"]):
        seq = chats["ids"][offsets[i]:offsets[i + 1]].tolist()
        pos = int(n_prompt)
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
    return emitted / steps


def measure(gguf_path: Path, work: Path, depths: tuple[int, ...], n_prompts: int | None = None) -> dict:
    """{kind: {depth: tokens per target step}} on the held-out chat and code answers."""
    from acespec.edge.llama_drafter import LlamaDrafter, LlamaDrafterConfig
    from acespec.models.smollm2_corpus import load_chunks

    drafter = LlamaDrafter(gguf_path, LlamaDrafterConfig(n_ctx=1024, n_seq_max=1, n_threads=1))
    out = {}
    for kind in ("eval_chat", "eval_code"):
        chats = _first(load_chunks(work / kind), n_prompts)
        out[kind.removeprefix("eval_")] = {
            str(d): round(greedy_acceptance(drafter, chats, d), 3) for d in depths}
        log.info("%s %s: %s", gguf_path.name, kind, out[kind.removeprefix("eval_")])
    drafter.close()
    return out


def _first(chats: dict[str, np.ndarray], n: int | None) -> dict[str, np.ndarray]:
    if n is None or n >= len(chats["lengths"]):
        return chats
    return {"ids": chats["ids"][:int(chats["lengths"][:n].sum())], "lengths": chats["lengths"][:n],
            "n_prompt": chats["n_prompt"][:n]}


def build(target_gguf: Path, out: Path, work: Path, preset_name: str = "smollm2",
          seed: int = 0) -> dict:
    """Every stage; returns the card's figures (also out/build.json and out/README.md)."""
    from acespec.models.gguf_export import export_gguf
    from acespec.models.smollm2_corpus import load_chunks

    preset = PRESETS[preset_name]
    out, work = Path(out), Path(work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    corpus_minutes = round(build_corpus(target_gguf, work, preset, seed)["seconds"] / 60, 1)
    model = _timed(work, "train", lambda: train_drafter(target_gguf, work, preset, seed))
    files = {}
    for ft in ("f16", "q8_0"):
        files[ft] = export_gguf(model, None, out / f"drafter-{ft}.gguf", ftype=ft,
                                name="acespec-smollm2-drafter", context_length=8192,
                                tokenizer_gguf=target_gguf)
    t0 = time.time()
    teacher_forced = heldout(model, work)
    log.info("held-out, teacher-forced: %s", teacher_forced)
    acc = measure(files["q8_0"], work, preset.depths)
    ref = measure(target_gguf, work, preset.depths, n_prompts=8) if preset.reference else None
    chunks = load_chunks(work / "train")
    card = {
        "preset": preset_name, "seed": seed, "drafter": asdict(model_args(preset)),
        "train": asdict(replace(preset.train, seed=seed)),
        "params": sum(p.numel() for p in model.parameters()), "answer_only": preset.answer_only,
        "code_ce_frac": preset.code_ce_frac,
        "corpus": {"chats": int(len(chunks["lengths"])), "tokens": int(len(chunks["ids"])),
                   "answer_tokens": int((chunks["lengths"] - chunks["n_prompt"]).sum()),
                   "greedy_chats": int((chunks["temperature"] == 0).sum()),
                   "code_tokens": int(len(np.load(work / "code.npy", mmap_mode="r"))),
                   "top_k": preset.top_k, "eval_prompts_per_kind": preset.n_eval_prompts,
                   "eval_new_tokens": preset.eval_new},
        "greedy_acceptance": acc, "reference_target_as_drafter": ref,
        "heldout_teacher_forced": teacher_forced,
        "minutes": {"corpus": corpus_minutes, **json.loads((work / "times.json").read_text()),
                    "measure": round((time.time() - t0) / 60, 1)},
        "files": {ft: {"name": p.name, "bytes": p.stat().st_size} for ft, p in files.items()},
    }
    (out / "build.json").write_text(json.dumps(card, indent=2) + "\n")
    from acespec.models.smollm2_card import write_card

    write_card(out, card)
    return card


def _timed(work: Path, name: str, fn):
    """Run a stage and record its minutes in work/times.json (kept when it is skipped)."""
    path = work / "times.json"
    times = json.loads(path.read_text()) if path.is_file() else {}
    t0 = time.time()
    result = fn()
    if name not in times:
        times[name] = round((time.time() - t0) / 60, 1)
        path.write_text(json.dumps(times))
    return result


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["corpus", "train", "all"])
    p.add_argument("--out", default="models/smollm2")
    p.add_argument("--target-gguf", required=True)
    p.add_argument("--work", default="/work/cache/smollm2-build")
    p.add_argument("--preset", default="smollm2", choices=sorted(PRESETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus-minutes", type=float, help="this run's corpus time budget")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if a.stage == "corpus":
        print(build_corpus(Path(a.target_gguf), Path(a.work), PRESETS[a.preset], a.seed,
                           a.corpus_minutes))
    elif a.stage == "train":
        train_drafter(Path(a.target_gguf), Path(a.work), PRESETS[a.preset], a.seed)
    else:
        build(Path(a.target_gguf), Path(a.out), Path(a.work), a.preset, a.seed)


if __name__ == "__main__":
    main()
