"""A Llama-family decoder (Llama, Qwen2, Qwen3) in plain PyTorch, scoring trees of nodes.

Parameter names follow Hugging Face (`model.layers.0.self_attn.q_proj.weight`, ...), so a
checkpoint's state dict loads as is and the model exports back unchanged. One forward pass
scores new nodes of several sequences at once: the linear layers run on all new tokens
together, attention runs per sequence over its own tree KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from acespec.cloud.config import ModelArgs
from acespec.cloud.kv_cache import KVCache, PagePool, Plan


@dataclass
class Request:
    """New nodes for one sequence in a batched forward pass."""

    tokens: Sequence[int]  # [n_new] token ids
    cache: KVCache
    parents: Sequence[int] | None = None  # [n_new] parent slots; None = chain off the last slot
    last_only: bool = False  # logits for the last node only (prefill)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, as the reference does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """[head_dim/2] float32 inverse frequencies, with linear or llama3 scaling applied."""
    d = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = args.rope_scaling
    if sc.get("rope_type") == "linear":
        return inv / sc["factor"]
    if sc.get("rope_type") == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old_ctx = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_ctx / lo, inv / factor, inv)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / hi) & (wavelen <= old_ctx / lo)
        return torch.where(medium, smoothed, scaled)
    return inv


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, hd]; cos/sin [n, hd]. Half-split rotation (HF `rotate_half`)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.args, self.layer = args, layer
        hd, h, kvh, d = args.head_dim, args.num_heads, args.num_kv_heads, args.hidden_size
        self.q_proj = nn.Linear(d, h * hd, bias=args.qkv_bias)
        self.k_proj = nn.Linear(d, kvh * hd, bias=args.qkv_bias)
        self.v_proj = nn.Linear(d, kvh * hd, bias=args.qkv_bias)
        self.o_proj = nn.Linear(h * hd, d, bias=args.o_bias)
        if args.qk_norm:
            self.q_norm = RMSNorm(hd, args.rms_norm_eps)
            self.k_norm = RMSNorm(hd, args.rms_norm_eps)

    def _qkv(self, x: torch.Tensor, rope):
        """x [..., n, d] -> q [..., n, h, hd], k and v [..., n, kvh, hd], RoPE applied."""
        a, lead = self.args, x.shape[:-1]
        q = self.q_proj(x).view(*lead, a.num_heads, a.head_dim)
        k = self.k_proj(x).view(*lead, a.num_kv_heads, a.head_dim)
        v = self.v_proj(x).view(*lead, a.num_kv_heads, a.head_dim)
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, *rope), apply_rope(k, *rope), v

    def causal(self, x: torch.Tensor, rope) -> torch.Tensor:
        """Training path: x [B, T, d] with a plain causal mask and no cache."""
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, rope))  # [B, heads, T, hd]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.args.num_heads != self.args.num_kv_heads)
        return self.o_proj(o.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                reqs: Sequence[Request], plans: Sequence[Plan], tree=None) -> torch.Tensor:
        """x [N, d] for all new nodes of all requests, in request order. tree: the batch's
        paged-attention arguments (acespec.cloud.attention) for the Triton path, else None."""
        q, k, v = self._qkv(x, rope)
        offset = 0
        for req, plan in zip(reqs, plans):
            n = len(req.tokens)
            req.cache.write(self.layer, plan.start, k[offset:offset + n], v[offset:offset + n])
            offset += n
        if tree is not None:
            o = tree.attend(self.layer, q)
        else:
            o = self._reference(q, reqs, plans)
        return self.o_proj(o.flatten(1))

    def _reference(self, q: torch.Tensor, reqs, plans) -> torch.Tensor:
        """Per sequence: SDPA over the cache's slots with the plan's dense mask."""
        a, out, offset = self.args, [], 0
        for req, plan in zip(reqs, plans):
            n = len(req.tokens)
            keys, values = req.cache.read(self.layer, plan.start + n)
            o = F.scaled_dot_product_attention(
                q[offset:offset + n].transpose(0, 1)[None], keys[None], values[None],
                attn_mask=plan.mask[None, None], enable_gqa=a.num_heads != a.num_kv_heads)
            out.append(o[0].transpose(0, 1))  # [n, h, hd]
            offset += n
        return torch.cat(out)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, f, b = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gate_proj = nn.Linear(d, f, bias=b)
        self.up_proj = nn.Linear(d, f, bias=b)
        self.down_proj = nn.Linear(f, d, bias=b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.self_attn = Attention(args, layer)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x, rope, reqs, plans, tree=None):
        x = x + self.self_attn(self.input_layernorm(x), rope, reqs, plans, tree)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class Transformer(nn.Module):
    """Causal LM: tokens of one or more trees in, next-token logits per new node out."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.kernels = "torch"  # attention path: "torch" (reference) or "triton"
        self._pool: PagePool | None = None

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def new_cache(self, capacity: int = 256) -> KVCache:
        """An empty sequence cache in the model's shared page pool."""
        a = self.args
        if self._pool is None or self._pool.k[0].dtype != self.dtype \
                or self._pool.k[0].device != self.device:
            self._pool = PagePool(a.num_layers, a.num_kv_heads, a.head_dim, self.dtype,
                                  self.device)
        return KVCache(a.num_layers, a.num_kv_heads, a.head_dim, self.dtype, self.device,
                       capacity, pool=self._pool)

    @torch.inference_mode()
    def forward_batch(self, reqs: Sequence[Request]) -> list[torch.Tensor]:
        """Score new nodes of several sequences in one pass. Returns per request logits
        [n_new, V] float32 ([1, V] for a request with last_only)."""
        plans = []
        try:
            for req in reqs:
                plans.append(req.cache.plan(req.parents, len(req.tokens)))
            return self._run(reqs, plans)
        except BaseException:
            for req, plan in zip(reqs, plans):
                req.cache.truncate(plan.start)
            raise

    def forward(self, tokens: Sequence[int], cache: KVCache,
                parents: Sequence[int] | None = None, last_only: bool = False) -> torch.Tensor:
        """Single-sequence convenience: logits [n_new, V] float32."""
        return self.forward_batch([Request(tokens, cache, parents, last_only)])[0]

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, head_dim] in the model dtype for int64 positions [n]."""
        freqs = positions[:, None].float() * rope_inv_freq(self.args).to(self.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def causal_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Training path: ids [B, T] int64 -> logits [B, T, V], causal mask, no cache."""
        rope = self._rope(torch.arange(ids.shape[1], device=ids.device))
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = x + layer.self_attn.causal(layer.input_layernorm(x), rope)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.model.norm(x))

    def _run(self, reqs, plans):
        ids = torch.tensor([t for r in reqs for t in r.tokens], dtype=torch.long, device=self.device)
        rope = self._rope(torch.cat([p.positions for p in plans]))
        x = self.model.embed_tokens(ids)
        tree = None
        if self.kernels == "triton":
            from acespec.cloud.attention import TreeBatch

            tree = TreeBatch.build(reqs, plans, self.args)
        for layer in self.model.layers:
            x = layer(x, rope, reqs, plans, tree)
        sizes = [len(r.tokens) for r in reqs]
        if any(r.last_only for r in reqs):
            ends = torch.tensor(sizes, device=self.device).cumsum(0)
            rows = torch.cat([torch.arange(e - (1 if r.last_only else n), e, device=self.device)
                              for r, n, e in zip(reqs, sizes, ends.tolist())])
            x, sizes = x[rows], [1 if r.last_only else n for r, n in zip(reqs, sizes)]
        logits = self.lm_head(self.model.norm(x)).float()
        return list(logits.split(sizes))
