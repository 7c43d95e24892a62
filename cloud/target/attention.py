"""The verifier's attention paths: the Triton tree-attention kernel over the paged cache, or
the torch reference (SDPA per sequence with a dense mask), chosen once at start.

`select_kernels("auto")` takes Triton on CUDA when it is installed and the reference
elsewhere; a flag forces either. `TreeBatch` gathers what the kernel needs for one forward
pass (block tables, lengths, query offsets, ancestor masks built on the device from the
tree region's parent pointers) once, for every layer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

KERNELS = ("auto", "triton", "torch")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401  # lazy: a probe; importing Triton is slow
    except ImportError:
        return False
    return True


def select_kernels(choice: str, device: torch.device | str) -> str:
    """'triton' or 'torch' for a requested choice; logs the decision and why."""
    if choice not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {choice!r}")
    dev = torch.device(device)
    if choice == "auto":
        chosen = "triton" if dev.type == "cuda" and triton_available() else "torch"
        why = "CUDA device and Triton installed" if chosen == "triton" else \
            f"device {dev.type}" + ("" if triton_available() else ", Triton not installed")
    else:
        if choice == "triton" and not triton_available():
            raise ValueError("--kernels triton: Triton is not installed (pip install triton)")
        chosen, why = choice, "forced by flag"
    log.info("verifier kernels: %s (%s)", "Triton tree attention + served encoder"
             if chosen == "triton" else "torch reference", why)
    return chosen


@dataclass
class TreeBatch:
    """Arguments of acespec.kernels.tree_attention for one forward pass."""

    pool: object  # the PagePool every request's cache lives in
    block_table: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32
    cu_q: torch.Tensor  # [S + 1] int32
    cutoff: torch.Tensor  # [N] int32
    tree_start: torch.Tensor  # [S] int32
    bits: torch.Tensor  # [N, W] int64
    scale: float

    @classmethod
    def build(cls, reqs, plans, args) -> TreeBatch:
        # lazy: the kernels module imports triton (optional) and jits its kernels on import
        from acespec.kernels.tree_attention import tree_masks

        caches = [r.cache for r in reqs]
        pool = caches[0].pool
        if any(c.pool is not pool for c in caches):
            raise ValueError("one forward pass needs every sequence in one page pool")
        dev = caches[0].device
        cuts, bits, lens, starts, sizes = [], [], [], [], []
        for req, plan in zip(reqs, plans):
            c, n = req.cache, len(req.tokens)
            region = torch.tensor(c.parent[c.n_linear:], dtype=torch.long, device=dev)
            cut, b = tree_masks(region, c.n_linear, torch.arange(plan.start, plan.start + n,
                                                                   device=dev))
            cuts.append(cut)
            bits.append(b)
            lens.append(plan.start + n)
            starts.append(c.n_linear)
            sizes.append(n)
        width = max(b.shape[1] for b in bits)
        bits = torch.cat([torch.nn.functional.pad(b, (0, width - b.shape[1])) for b in bits])
        n_blocks = max(len(c.blocks) for c in caches)
        table = torch.zeros(len(caches), n_blocks, dtype=torch.int32, device=dev)
        for i, c in enumerate(caches):
            table[i, :len(c.blocks)] = c.block_table.to(torch.int32)
        i32 = dict(dtype=torch.int32, device=dev)
        cu_q = torch.zeros(len(sizes) + 1, **i32)
        cu_q[1:] = torch.tensor(sizes, **i32).cumsum(0)
        return cls(pool, table, torch.tensor(lens, **i32), cu_q, torch.cat(cuts),
                   torch.tensor(starts, **i32), bits, args.head_dim ** -0.5)

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [N, H, D] -> attention output [N, H, D]."""
        from acespec.kernels.tree_attention import tree_attention  # lazy: as build's

        with self.pool.lock:
            return tree_attention(q.contiguous(), self.pool.k[layer], self.pool.v[layer],
                                  self.block_table, self.seq_lens, self.cu_q, self.cutoff,
                                  self.tree_start, self.bits, self.scale)
