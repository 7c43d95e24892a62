"""The torch target answering many chats side by side: the answer stage's fast path.

llama.cpp decodes the build's answers one token per sequence per call, so each call streams
every weight for a single token. The torch target in bfloat16, where the CPU has native
bfloat16 (or on CUDA), decodes 64 chats per step through one matmul per weight, with a
plain contiguous KV cache per chat: several times the throughput for the same answers.

`TorchBatch` has the interface `corpus.generate_corpus` drives (`chat_template`, `tokenize`,
`n_ctx_seq`, `generate`); tokenization is llama.cpp's (the target GGUF's own), so the ids
are exactly what the edge and the verifier would see.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from acespec.cloud.target.loader import load_model
from acespec.models.smollm2.corpus import _sample
from acespec.models.smollm2.teacher import fast_dtype, topk_rows

log = logging.getLogger(__name__)


class TorchBatch:
    """The target (Hugging Face checkpoint `target_dir`) answering `n_seq` chats at a time,
    each of up to `n_ctx_seq` tokens (prompt + answer); `tok` (a corpus.LlamaBatch) tokenizes."""

    def __init__(self, target_dir: Path, tok, n_seq: int = 64, n_ctx_seq: int = 640,
                 device: torch.device | str = "cpu"):
        device = torch.device(device)
        self.model = load_model(target_dir, dtype=fast_dtype(device), device=device).eval()
        self.tok, self.n_seq, self.n_ctx_seq = tok, n_seq, n_ctx_seq
        self.eos_id = tok.eos_id
        log.info("answers: torch target, %s on %s, %d chats side by side", self.model.dtype,
                 device, n_seq)

    def chat_template(self) -> str:
        return self.tok.chat_template()

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        return self.tok.tokenize(text, special)

    def generate(self, prompts: list[list[int]], max_new: int, temperatures: list[float],
                 rng: np.random.Generator, k: int, top_p: float = 0.95) -> list[dict]:
        """As corpus.LlamaBatch.generate: per prompt {'ids': prompt + answer [n] int32,
        'n_prompt', 'top_ids': [n - 1, k] uint16, 'top_p': [n - 1, k] float16}."""
        out = []
        for g in range(0, len(prompts), self.n_seq):
            out += self._group(prompts[g:g + self.n_seq], max_new,
                               temperatures[g:g + self.n_seq], rng, k, top_p)
        return out

    @torch.inference_mode()
    def _group(self, part: list[list[int]], max_new: int, temps: list[float],
               rng: np.random.Generator, k: int, top_p: float) -> list[dict]:
        a, dev = self.model.args, self.model.device
        width = max(map(len, part)) + max_new
        shape = (len(part), a.num_kv_heads, width, a.head_dim)
        kv = [tuple(torch.zeros(shape, dtype=self.model.dtype, device=dev) for _ in "kv")
              for _ in range(a.num_layers)]  # per layer (K, V) [B, kvh, width, hd]
        tops: list[list[tuple]] = []
        last = []  # per chat: logits [V] float32 after its last token
        for b, ids in enumerate(part):
            logits = self._prefill(kv, b, ids)  # [n, V]
            tops.append([topk_rows(logits, k)])
            last.append(logits[-1].cpu().numpy())
        answers: list[list[int]] = [[] for _ in part]
        live = set(range(len(part)))
        pos = np.array([len(p) for p in part])
        for _ in range(max_new):
            toks = np.zeros(len(part), np.int64)
            for b in sorted(live):
                toks[b] = _sample(last[b], temps[b], top_p, rng)
                answers[b].append(int(toks[b]))
                if toks[b] == self.eos_id or len(answers[b]) == max_new:
                    live.discard(b)
            if not live:
                break
            block = self._step(kv, torch.from_numpy(toks).to(dev),
                               torch.from_numpy(pos).to(dev))  # [B, V]
            pos += 1  # finished chats run along (their rows are never read again)
            order = sorted(live)
            t_ids, t_p = topk_rows(block[order], k)
            for i, (b, logits) in enumerate(zip(order, block[order].cpu().numpy())):
                last[b] = logits
                tops[b].append((t_ids[i:i + 1], t_p[i:i + 1]))
        return [{"ids": np.array(ids + ans, dtype=np.int32), "n_prompt": len(ids),
                 "top_ids": np.concatenate([t[0] for t in top])[:len(ids) + len(ans) - 1],
                 "top_p": np.concatenate([t[1] for t in top])[:len(ids) + len(ans) - 1]}
                for ids, ans, top in zip(part, answers, tops)]

    def _prefill(self, kv, b: int, ids: list[int]) -> torch.Tensor:
        """Chat b's prompt through the model, its KV written at slots [0, n): logits [n, V]."""
        m, dev = self.model, self.model.device
        x = m.model.embed_tokens(torch.tensor([ids], device=dev))  # [1, n, d]
        rope = m._rope(torch.arange(len(ids), device=dev))
        for layer, (keys, values) in zip(m.model.layers, kv):
            att = layer.self_attn
            q, k, v = (t.transpose(1, 2) for t in att._qkv(layer.input_layernorm(x), rope))
            keys[b, :, :len(ids)], values[b, :, :len(ids)] = k[0], v[0]  # [kvh, n, hd]
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               enable_gqa=_gqa(m.args))
            x = x + att.o_proj(o.transpose(1, 2).flatten(2))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return m.lm_head(m.model.norm(x[0])).float()

    def _step(self, kv, toks: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One token per chat (toks [B] int64 at positions pos [B]): logits [B, V] float32."""
        m, a = self.model, self.model.args
        n, group = len(toks), a.num_heads // a.num_kv_heads
        rows = torch.arange(n, device=toks.device)
        width = int(pos.max()) + 1  # no chat has written past this slot
        hidden = (torch.arange(width, device=toks.device)[None, :] > pos[:, None])[:, None, None]
        x = m.model.embed_tokens(toks)  # [B, d]
        rope = m._rope(pos)  # per chat its own position
        for layer, (keys, values) in zip(m.model.layers, kv):
            att = layer.self_attn
            q, k, v = att._qkv(layer.input_layernorm(x), rope)  # [B, h|kvh, hd]
            keys[rows, :, pos], values[rows, :, pos] = k, v
            # The query heads of a KV head as its rows: plain matmuls, no GQA expansion of
            # the cache (SDPA's enable_gqa copies it: 4x slower here).
            s = (q.view(n, a.num_kv_heads, group, a.head_dim) @ keys[:, :, :width].transpose(-1, -2))
            s = s.float().mul_(a.head_dim ** -0.5).masked_fill_(hidden, float("-inf"))
            o = torch.softmax(s, -1).to(values.dtype) @ values[:, :, :width]  # [B, kvh, g, hd]
            x = x + att.o_proj(o.flatten(1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return m.lm_head(m.model.norm(x)).float()


def _gqa(args) -> bool:
    return args.num_heads != args.num_kv_heads
