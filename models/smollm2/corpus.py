"""The target's own answers and its top-k next-token distributions, computed with llama.cpp.

`LlamaBatch` is a minimal multi-sequence llama.cpp context: `generate` decodes many chats
side by side (one token per live sequence per `llama_decode`, which on a CPU costs little
more than one), and `topk` evaluates a whole sequence with logits for every position.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import time
from pathlib import Path

import jinja2
import numpy as np

from acespec.edge.drafting.llama_lib import silence, tokenize

log = logging.getLogger(__name__)


def render_chat(template: str, user: str) -> str:
    """The chat template applied to one user message, ready for the assistant's answer."""
    return _compiled(template).render(messages=[{"role": "user", "content": user}],
                                            add_generation_prompt=True, bos_token="",
                                            eos_token="")


@functools.lru_cache(maxsize=4)
def _compiled(template: str):
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template)


class LlamaBatch:
    """A GGUF model with a context of n_seq sequences of up to n_ctx_seq tokens each."""

    def __init__(self, path: str | Path, n_seq: int = 16, n_ctx_seq: int = 512,
                 n_batch: int = 512, threads: int = 1):
        import llama_cpp as ll  # lazy: llama.cpp's native library, loaded when a GGUF runs

        silence(ll)
        ll.llama_backend_init()
        self._ll, self.n_seq, self.n_batch, self.n_ctx_seq = ll, n_seq, n_batch, n_ctx_seq
        self._model = ll.llama_model_load_from_file(str(path).encode(),
                                                    ll.llama_model_default_params())
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        p = ll.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_seq * n_ctx_seq, n_batch, n_batch, n_seq
        p.n_threads = p.n_threads_batch = threads
        p.kv_unified = True
        self._ctx = ll.llama_init_from_model(self._model, p)
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._mem = ll.llama_get_memory(self._ctx)
        self.vocab_size = ll.llama_vocab_n_tokens(self._vocab)
        self.eos_id = int(ll.llama_vocab_eos(self._vocab))
        self._batch = ll.llama_batch_init(n_batch, 0, 1)

    def chat_template(self) -> str:
        return self._ll.llama_model_chat_template(self._model, None).decode("utf-8")

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """llama.cpp's token ids for `text` (no BOS; special tokens parsed when `special`)."""
        return tokenize(self._ll, self._vocab, text, special)

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """rows: (token, position, seq, wants logits), at most n_batch of them."""
        b = self._batch
        for i, (tok, pos, seq, want) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, want
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)
        rc = self._ll.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")

    def _logits(self, i: int) -> np.ndarray:
        """[V] float32 logits of row i of the last decode (a view: copy before the next)."""
        ptr = self._ll.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                     shape=(self.vocab_size,))

    def _prefill(self, seq: int, ids: list[int]) -> np.ndarray:
        """Feed ids into an empty `seq`; logits [len(ids), V] float32 for every position."""
        self._ll.llama_memory_seq_rm(self._mem, seq, 0, -1)
        out = np.empty((len(ids), self.vocab_size), dtype=np.float32)
        for s in range(0, len(ids), self.n_batch):
            chunk = ids[s:s + self.n_batch]
            self._decode([(t, s + i, seq, True) for i, t in enumerate(chunk)])
            for i in range(len(chunk)):
                out[s + i] = self._logits(i)
        return out

    def topk(self, ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The model's top-k next tokens after each position of `ids` (see `topk_probs`)."""
        return topk_probs(self._prefill(0, ids), k)

    def generate(self, prompts: list[list[int]], max_new: int, temperatures: list[float],
                 rng: np.random.Generator, k: int, top_p: float = 0.95) -> list[dict]:
        """Answer each prompt, n_seq at a time (temperature 0: greedy, else nucleus sampling
        with `top_p`), keeping the model's top-k distribution after every token but the
        last: {'ids': prompt + answer [n] int32, 'top_ids': [n - 1, k] uint16,
        'top_p': [n - 1, k] float16}. The answer stops after EOS or max_new tokens."""
        out = []
        for g in range(0, len(prompts), self.n_seq):
            part = prompts[g:g + self.n_seq]
            tops: list[list[tuple]] = []  # per seq: (ids [n, k], p [n, k]) blocks
            answers: list[list[int]] = [[] for _ in part]
            live = {}  # seq -> logits [V] after its last token
            for seq, ids in enumerate(part):
                logits = self._prefill(seq, ids)
                tops.append([topk_probs(logits, k)])
                live[seq] = logits[-1]
            for _ in range(max_new):
                rows = []
                for seq, logits in list(live.items()):
                    tok = _sample(logits, temperatures[g + seq], top_p, rng)
                    answers[seq].append(tok)
                    if tok == self.eos_id or len(answers[seq]) == max_new:
                        del live[seq]
                    else:
                        rows.append((tok, len(part[seq]) + len(answers[seq]) - 1, seq, True))
                if not rows:
                    break
                self._decode(rows)
                block = np.stack([self._logits(i) for i in range(len(rows))])
                t_ids, t_p = topk_probs(block, k)
                for i, (_, _, seq, _) in enumerate(rows):
                    live[seq] = block[i]
                    tops[seq].append((t_ids[i:i + 1], t_p[i:i + 1]))
            for seq, ids in enumerate(part):
                n = len(ids) + len(answers[seq]) - 1
                out.append({"ids": np.array(ids + answers[seq], dtype=np.int32),
                            "n_prompt": len(ids),
                            "top_ids": np.concatenate([t[0] for t in tops[seq]])[:n],
                            "top_p": np.concatenate([t[1] for t in tops[seq]])[:n]})
        return out

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ll.llama_model_free(self._model)
            self._ctx = None

    def __del__(self):
        self.close()


def topk_probs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits [T, V] -> the top-k token ids [T, k] uint16 (by decreasing probability) and
    their probabilities renormalised over the k [T, k] float16."""
    top = np.argpartition(-logits, k, axis=1)[:, :k]
    vals = np.take_along_axis(logits, top, 1)
    order = np.argsort(-vals, axis=1)
    top, vals = np.take_along_axis(top, order, 1), np.take_along_axis(vals, order, 1)
    p = np.exp(vals - vals[:, :1])
    return top.astype(np.uint16), (p / p.sum(1, keepdims=True)).astype(np.float16)


def _sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits / temperature
    top = np.argpartition(-z, 64)[:64]  # nucleus lies well inside the top 64 at T <= 1
    p = np.exp(z[top] - z[top].max())
    order = np.argsort(-p)
    p = p[order] / p.sum()
    keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
    return int(top[order[rng.choice(keep, p=p[:keep] / p[:keep].sum())]])


def generate_corpus(model: LlamaBatch, texts: list[str], max_new: int, greedy_frac: float,
                    temperature: float, k: int, seed: int, out: Path, chunk: int = 64,
                    deadline: float = float("inf")) -> list[int]:
    """Chat-render each user text, answer it with the model and keep the teacher's top-k at
    every position: one `chunk-NNNNN.npz` per `chunk` texts in folder `out` (tokens
    concatenated, with lengths), written atomically, so an interrupted run resumes after the
    last complete chunk. Prompts too long for the context (with max_new) are left out; no
    chunk starts after `deadline` (time.time()). Returns the indices into `texts` of the
    prompts kept, in the order their answers are stored."""
    out.mkdir(parents=True, exist_ok=True)
    template = model.chat_template()
    rng = np.random.default_rng(seed)
    temps = [0.0 if rng.random() < greedy_frac else temperature for _ in texts]
    prompts_all = [model.tokenize(render_chat(template, t)) for t in texts]
    keep = [i for i, p in enumerate(prompts_all) if len(p) + max_new <= model.n_ctx_seq]
    prompts_all, temps = [prompts_all[i] for i in keep], [temps[i] for i in keep]
    t0, n_tok = time.time(), 0
    for s in range(0, len(prompts_all), chunk):
        path = out / f"chunk-{s // chunk:05d}.npz"
        if path.is_file():
            continue
        if time.time() > deadline:
            log.info("corpus: time budget reached after %d chats", s)
            break
        recs = model.generate(prompts_all[s:s + chunk], max_new, temps[s:s + chunk],
                              np.random.default_rng([seed, s]), k)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, ids=np.concatenate([r["ids"] for r in recs]),
                 lengths=np.array([len(r["ids"]) for r in recs], dtype=np.int32),
                 n_prompt=np.array([r["n_prompt"] for r in recs], dtype=np.int32),
                 temperature=np.array(temps[s:s + chunk], dtype=np.float32),
                 top_ids=np.concatenate([r["top_ids"] for r in recs]),
                 top_p=np.concatenate([r["top_p"] for r in recs]))
        tmp.replace(path)
        n_tok += sum(len(r["ids"]) for r in recs)
        log.info("corpus: %d/%d chats, %.0f tok/s (prompt + answer, teacher top-%d kept)",
                 min(s + chunk, len(prompts_all)), len(prompts_all), n_tok / (time.time() - t0), k)
    return keep


def load_chunks(folder: Path) -> dict[str, np.ndarray]:
    """All chunks of a corpus folder, concatenated (lengths/n_prompt per sequence)."""
    parts = [np.load(p) for p in sorted(folder.glob("chunk-*.npz"))]
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0].files}
