"""The Megatron split of a Llama-family target over tensor-parallel ranks.

Rank r of N holds query heads [r*H/N, (r+1)*H/N) and the KV heads they read (GQA groups
stay whole, so N must divide the KV heads), and MLP columns [r*F/N, (r+1)*F/N):
  column-split (rows of the weight): q/k/v_proj, gate/up_proj (and their biases);
  row-split (columns of the weight): o_proj, down_proj; their biases live on rank 0 only,
    so the all-reduce after each adds them once;
  replicated: the embedding, the norms (qk_norm's per-head weights too) and the head.
The head is replicated, not split by vocabulary: only rank 0 applies it (the others stop
at the last layer), so a pass moves no logits between ranks at all, where a vocabulary
split would all-gather [nodes, V] float32 per pass (49k x 4 B = 192 KiB per node for
SmolLM2, more than the whole pass's all-reduces).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open

from acespec.cloud.target.config import ModelArgs

COLUMN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias",
          "v_proj.bias", "gate_proj.weight", "up_proj.weight", "gate_proj.bias", "up_proj.bias")
ROW = ("o_proj.weight", "down_proj.weight")
ROW_BIAS = ("o_proj.bias", "down_proj.bias")


def check_tp(args: ModelArgs, n: int, where: str = "the model") -> None:
    """ValueError naming what N does not divide (one line)."""
    if n < 1:
        raise ValueError(f"--tp must be at least 1, got {n}")
    parts = {"KV heads": args.num_kv_heads, "query heads": args.num_heads,
             "MLP width (intermediate_size)": args.intermediate_size}
    bad = [f"{v} {k}" for k, v in parts.items() if v % n]
    if bad:
        fits = [d for d in range(1, args.num_kv_heads + 1)
                if not any(v % d for v in parts.values())]
        raise ValueError(f"--tp {n} must divide the model's {' and '.join(bad)} ({where}: "
                         f"{args.num_heads} query / {args.num_kv_heads} KV heads, MLP "
                         f"{args.intermediate_size}); --tp can be {', '.join(map(str, fits))}")


def shard_args(args: ModelArgs, n: int) -> ModelArgs:
    """The hyper-parameters of one rank's shard."""
    check_tp(args, n)
    return replace(args, num_heads=args.num_heads // n, num_kv_heads=args.num_kv_heads // n,
                   intermediate_size=args.intermediate_size // n)


def shard_slice(name: str, shape: tuple[int, ...], rank: int, n: int
                ) -> tuple[slice, ...] | None:
    """The index of `name`'s shard on `rank` (a tuple of slices), or None for a tensor this
    rank holds as zeros (a row-split bias off rank 0)."""
    if n == 1:
        return tuple(slice(None) for _ in shape)
    if name.endswith(COLUMN):
        size = shape[0] // n
        return (slice(rank * size, (rank + 1) * size), *(slice(None) for _ in shape[1:]))
    if name.endswith(ROW):
        size = shape[1] // n
        return (slice(None), slice(rank * size, (rank + 1) * size))
    if name.endswith(ROW_BIAS) and rank:
        return None
    return tuple(slice(None) for _ in shape)


def read_shard(files: list[Path], names: set[str], rank: int, n: int, device: str
               ) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Only this rank's part of every tensor in `names`, read straight from the safetensors
    files (a rank never holds the whole checkpoint); and the names the files hold."""
    state, held = {}, set()
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as st:
            for name in st.keys():
                held.add(name)
                if name not in names:
                    continue
                part = st.get_slice(name)
                index = shard_slice(name, tuple(part.get_shape()), rank, n)
                # A bias this rank must not add again: zeros (it is one vector).
                state[name] = torch.zeros_like(part[:]) if index is None else part[index]
    return state, held


def fingerprint(path: Path, files: list[Path]) -> str:
    """sha256 of config.json and each weights file's size and safetensors header (names,
    dtypes, shapes, offsets): ranks that print the same saw the same checkpoint layout,
    without reading gigabytes of weights."""
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in files:
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = fh.read(size)
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        h.update(json.dumps(json.loads(header), sort_keys=True).encode())
    return h.hexdigest()[:16]
