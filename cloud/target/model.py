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

from acespec.cloud.target.attention import TreeBatch
from acespec.cloud.target.config import ModelArgs
from acespec.cloud.target.kv_cache import KVCache, PagePool, SeqPass


@dataclass
class Request:
    """New nodes for one sequence in a batched forward pass."""

    tokens: Sequence[int]  # [n_new] token ids
    cache: KVCache
    parents: Sequence[int] | None = None  # [n_new] parent slots; None = chain off the last slot
    last_only: bool = False  # logits for the last node only (prefill)


@dataclass
class Pass:
    """One batched forward pass, planned: what every tensor-parallel rank runs alike."""

    ids: torch.Tensor  # [N] int64 token ids of all new nodes, in request order
    positions: torch.Tensor  # [N] int64 RoPE positions
    seqs: list[SeqPass]  # per request: its pool rows and mask


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


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
                pool: PagePool, seqs: Sequence[SeqPass], tree=None) -> torch.Tensor:
        """x [N, d] for all new nodes of all sequences, in order. tree: the batch's
        paged-attention arguments (acespec.cloud.target.attention) for the Triton path, else None.
        Under tensor parallelism the result is this rank's partial sum."""
        q, k, v = self._qkv(x, rope)
        offset = 0
        for s in seqs:
            pool.write(self.layer, s.write_rows, k[offset:offset + s.n], v[offset:offset + s.n])
            offset += s.n
        if tree is not None:
            o = tree.attend(self.layer, q)
        else:
            o = self._reference(q, pool, seqs)
        return self.o_proj(o.flatten(1))

    def _reference(self, q: torch.Tensor, pool: PagePool, seqs: Sequence[SeqPass]
                   ) -> torch.Tensor:
        """Per sequence: SDPA over its rows with its dense mask."""
        a, out, offset = self.args, [], 0
        for s in seqs:
            keys, values = pool.read(self.layer, s.read_rows)
            o = F.scaled_dot_product_attention(
                q[offset:offset + s.n].transpose(0, 1)[None], keys[None], values[None],
                attn_mask=s.mask[None, None], enable_gqa=a.num_heads != a.num_kv_heads)
            out.append(o[0].transpose(0, 1))  # [n, h, hd]
            offset += s.n
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
        # Sums the ranks' partial outputs under tensor parallelism (an all-reduce).
        self.reduce = _same

    def forward(self, x, rope, pool, seqs, tree=None):
        x = x + self.reduce(self.self_attn(self.input_layernorm(x), rope, pool, seqs, tree))
        return x + self.reduce(self.mlp(self.post_attention_layernorm(x)))


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
        # Tensor parallelism (acespec.cloud.target.tensor_parallel): rank 0's leader, which sends
        # every pass to the other ranks first; None on one device.
        self.tp = None

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def pool(self) -> PagePool:
        """The page pool every sequence cache of this model lives in."""
        a = self.args
        if self._pool is None or self._pool.k[0].dtype != self.dtype \
                or self._pool.k[0].device != self.device:
            self._pool = PagePool(a.num_layers, a.num_kv_heads, a.head_dim, self.dtype,
                                  self.device, mirror=self.tp.record if self.tp else None)
        return self._pool

    def new_cache(self, capacity: int = 256) -> KVCache:
        """An empty sequence cache in the model's shared page pool."""
        a = self.args
        return KVCache(a.num_layers, a.num_kv_heads, a.head_dim, self.dtype, self.device,
                       capacity, pool=self.pool)

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

    def _run(self, reqs, plans) -> list[torch.Tensor]:
        step = Pass(
            torch.tensor([t for r in reqs for t in r.tokens], dtype=torch.long,
                         device=self.device),
            torch.cat([p.positions for p in plans]),
            [r.cache.seq_pass(p, len(r.tokens), r.last_only) for r, p in zip(reqs, plans)])
        tree = None
        if self.kernels == "triton":
            tree = TreeBatch.build(reqs, plans, self.args)
        if self.tp is None:
            x = self.hidden(step, tree)
        else:
            with self.tp.passing(step):  # the other ranks run the same pass beside this one
                x = self.hidden(step, tree)
        return self.head(step, x)

    def hidden(self, step: Pass, tree=None) -> torch.Tensor:
        """The last layer's output [N, d] for every new node; writes their KV."""
        rope = self._rope(step.positions)
        x = self.model.embed_tokens(step.ids)
        pool = self.pool
        for layer in self.model.layers:
            x = layer(x, rope, pool, step.seqs, tree)
        return x

    def head(self, step: Pass, x: torch.Tensor) -> list[torch.Tensor]:
        """Per sequence float32 logits [n, V] ([1, V] for last_only) from hidden x [N, d]."""
        sizes = [s.n for s in step.seqs]
        if any(s.last_only for s in step.seqs):
            ends = torch.tensor(sizes, device=self.device).cumsum(0)
            rows = torch.cat([torch.arange(e - (1 if s.last_only else s.n), e,
                                           device=self.device)
                              for s, e in zip(step.seqs, ends.tolist())])
            x, sizes = x[rows], [1 if s.last_only else s.n for s in step.seqs]
        logits = self.lm_head(self.model.norm(x)).float()
        return list(logits.split(sizes))
