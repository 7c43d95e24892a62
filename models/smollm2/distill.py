"""Training material and objective for the SmolLM2 drafter.

Batches are whole chats (prompt + the target's answer, or a conversation teacher-forced),
length-bucketed and right-padded (causal attention: padding after a sequence never reaches
it); the loss is the cross-entropy to the teacher's renormalised top-k at every position
(`answer_only`: only where answer tokens are predicted).

The softmax is sampled: the output layer is evaluated on the step's candidates only, every
token the step's teacher top-k names plus `n_negative` others drawn
uniformly, whose logits get + log(others / n_negative) so their sum stands in for all of
them. On this CPU the 49k-wide layer and its gradient are most of a step otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from acespec.models.train import TrainConfig

log = logging.getLogger(__name__)
PAD = 2  # <|im_end|>: any id works, padded positions carry no loss


@dataclass(frozen=True)
class TeacherData:
    ids: np.ndarray  # [n_tokens] int32 all chats concatenated
    starts: np.ndarray  # [n_seq] int64 offset of each chat in ids
    lengths: np.ndarray  # [n_seq] int32
    n_prompt: np.ndarray  # [n_seq] int32 prompt tokens at the start of each chat
    row_starts: np.ndarray  # [n_seq] int64 offset of each chat's teacher rows (length - 1)
    top_ids: np.ndarray  # [n_rows, k] uint16
    top_p: np.ndarray  # [n_rows, k] float16

    @classmethod
    def from_chunks(cls, chunks: dict[str, np.ndarray]) -> TeacherData:
        lengths = chunks["lengths"]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        rows = np.concatenate([[0], np.cumsum(lengths - 1)[:-1]]).astype(np.int64)
        return cls(chunks["ids"], starts, lengths, chunks["n_prompt"], rows, chunks["top_ids"],
                   chunks["top_p"])


class Batches:
    """batches(step) -> x [B, T + 1] int64 for train(); forward(model, x, step) -> logits
    [N, V] at the step's scored positions; loss(logits, x, step) its objective."""

    def __init__(self, teacher: TeacherData, cfg: TrainConfig, n_negative: int = 4096,
                 vocab_size: int = 49152, answer_only: bool = False,
                 device: torch.device | str = "cpu"):
        self.t, self.cfg = teacher, cfg
        self.n_negative, self.vocab_size, self.answer_only = n_negative, vocab_size, answer_only
        self.max_len = cfg.seq_len + 1
        self.device = torch.device(device)
        lengths = np.minimum(teacher.lengths, self.max_len)
        order = np.argsort(lengths, kind="stable")
        budget = cfg.batch * cfg.seq_len  # tokens per distillation batch
        self.buckets, cur = [], []
        for i in order:  # consecutive by length, as many as fit the token budget
            if cur and (len(cur) + 1) * lengths[i] > budget:
                self.buckets.append(np.array(cur))
                cur = []
            cur.append(i)
        if cur:
            self.buckets.append(np.array(cur))
        # step, target ids (into the candidates), their probabilities, scored [B, T] bool,
        # candidates [C] int64, logit correction [C] float32
        self._last: tuple = (-1, None, None, None, None, None)

    def _bucket(self, step: int) -> np.ndarray:
        """The chats of the step: buckets visited in a fresh seeded order every epoch."""
        epoch, i = divmod(step, len(self.buckets))
        perm = np.random.default_rng([self.cfg.seed, 17, epoch]).permutation(len(self.buckets))
        return self.buckets[perm[i]]

    def __call__(self, step: int) -> torch.Tensor:
        seqs = self._bucket(step)
        t, k = self.t, self.t.top_ids.shape[1]
        n = int(min(self.max_len, t.lengths[seqs].max()))
        x = np.full((len(seqs), n), PAD, dtype=np.int64)
        ids = np.zeros((len(seqs), n - 1, k), dtype=np.int64)
        p = np.zeros((len(seqs), n - 1, k), dtype=np.float32)
        scored = np.zeros((len(seqs), n - 1), dtype=bool)
        for j, s in enumerate(seqs):
            m = int(min(n, t.lengths[s]))
            x[j, :m] = t.ids[t.starts[s]:t.starts[s] + m]
            ids[j, :m - 1] = t.top_ids[t.row_starts[s]:t.row_starts[s] + m - 1]
            p[j, :m - 1] = t.top_p[t.row_starts[s]:t.row_starts[s] + m - 1]
            scored[j, min(t.n_prompt[s], m) - 1 if self.answer_only else 0:m - 1] = True
        self._set(step, ids[scored], p[scored], scored)
        return torch.from_numpy(x)

    def _set(self, step: int, ids: np.ndarray, p: np.ndarray, scored: np.ndarray) -> None:
        """Candidates: the targets' ids plus uniform negatives; ids remapped into them."""
        pos, inv = np.unique(ids, return_inverse=True)
        rng = np.random.default_rng([self.cfg.seed, 31, step])
        others = np.setdiff1d(np.arange(self.vocab_size), pos, assume_unique=True)
        neg = rng.choice(others, size=min(self.n_negative, len(others)), replace=False)
        corr = np.concatenate([np.zeros(len(pos)), np.full(len(neg), np.log(len(others) / max(1, len(neg))))])
        arrays = (inv.reshape(ids.shape), p, scored, np.concatenate([pos, neg]),
                  corr.astype(np.float32))
        self._last = (step, *(torch.from_numpy(a).to(self.device) for a in arrays))

    def forward(self, model, x: torch.Tensor, step: int) -> torch.Tensor:
        """The model's logits [N, C] for the step's candidates at its scored positions."""
        if self._last[0] != step:
            raise RuntimeError("forward called for a step whose batch was not drawn last")
        m = model.model
        ids = x[:, :-1].to(self.device)
        rope = model._rope(torch.arange(ids.shape[1], device=self.device))
        h = m.embed_tokens(ids)
        for layer in m.layers:  # as Transformer.causal_logits, minus the full-width head
            h = h + layer.self_attn.causal(layer.input_layernorm(h), rope)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        _, _, _, scored, cand, corr = self._last
        w = model.lm_head.weight[cand]  # [C, d]
        return F.linear(m.norm(h[scored]), w) + corr

    def loss(self, logits: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        """logits [N, C] from `forward`: cross-entropy to the step's teacher top-k, nats per
        scored position."""
        last, ids, p = self._last[:3]
        if last != step:
            raise RuntimeError("loss called for a step whose batch was not drawn last")
        lq = torch.log_softmax(logits, dim=-1).gather(-1, ids)  # [N, k]
        return -(p * lq).sum(-1).mean()
