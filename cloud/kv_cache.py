"""A per-sequence KV cache whose slots form a tree.

Slots are appended in topological order (a parent always has a lower slot than its
children). The attention pattern is encoded cheaply: slots [0, n_linear) are a chain
(slot i's parent is i-1) and every node sees the chain up to its deepest chain ancestor
(`cutoff`), plus an explicit set of its ancestors among the tree slots beyond the chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

ROOT = -1  # parent id of a node with no parent (the first token of the sequence)


class TreeError(ValueError):
    """A parent pointer or slot list is inconsistent with the cache's tree."""


@dataclass
class Plan:
    """Where a batch of new nodes goes and what each may attend to."""

    start: int  # first slot of the new nodes
    positions: torch.Tensor  # [n_new] int64 RoPE positions (depth in the tree)
    mask: torch.Tensor  # [n_new, start + n_new] bool, True = may attend


class KVCache:
    """Keys/values of one sequence: per layer [n_kv_heads, capacity, head_dim]."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", capacity: int = 256):
        shape = (num_kv_heads, capacity, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.parent: list[int] = []  # [length] parent slot, ROOT for none
        self.depth: list[int] = []  # [length] RoPE position
        self._cutoff: list[int] = []  # [length] chain slots < cutoff are ancestors-or-self
        self._extra: list[frozenset[int]] = []  # [length] tree ancestors-or-self beyond the chain
        self.n_linear = 0

    @property
    def length(self) -> int:
        return len(self.parent)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    def nbytes(self) -> int:
        return sum(t[:, : self.length].nbytes for t in self.k + self.v)

    def plan(self, parents: Sequence[int] | None, n_new: int) -> Plan:
        """Validate and record n_new nodes; parents are slots (ROOT allowed), None = a chain
        continuing from the last slot. Returns positions and the attention mask."""
        start = self.length
        if parents is None:
            parents = [start - 1 + i if start + i > 0 else ROOT for i in range(n_new)]
        if len(parents) != n_new:
            raise TreeError(f"{len(parents)} parents for {n_new} new nodes")
        for i, p in enumerate(parents):
            if not ROOT <= p < start + i:
                raise TreeError(f"node {start + i}: parent {p} is not an earlier slot")
        if start + n_new > self.capacity:
            self._grow(start + n_new)
        for p in parents:
            self._append(int(p))
        device = self.k[0].device
        end = start + n_new
        cols = torch.arange(end, device=device)
        cutoff = torch.tensor(self._cutoff[start:end], device=device)
        mask = cols[None, :] < cutoff[:, None]
        rows = [i for i in range(n_new) for _ in self._extra[start + i]]
        extra = [s for i in range(n_new) for s in self._extra[start + i]]
        mask[rows, extra] = True
        positions = torch.tensor(self.depth[start:end], dtype=torch.long, device=device)
        return Plan(start=start, positions=positions, mask=mask)

    def _append(self, p: int) -> None:
        slot = self.length
        self.parent.append(p)
        self.depth.append(0 if p == ROOT else self.depth[p] + 1)
        if p == slot - 1 and self.n_linear == slot:
            self.n_linear += 1  # still a chain
            self._cutoff.append(slot + 1)
            self._extra.append(frozenset())
        elif p < self.n_linear:
            self._cutoff.append(p + 1)
            self._extra.append(frozenset([slot]))
        else:
            self._cutoff.append(self._cutoff[p])
            self._extra.append(self._extra[p] | {slot})

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [n_kv, n_new, hd] at slots [start, start+n_new); return the cache
        views [n_kv, start+n_new, hd] the new queries attend over."""
        end = start + k.shape[1]
        self.k[layer][:, start:end] = k
        self.v[layer][:, start:end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def truncate(self, length: int) -> None:
        """Forget slots >= length (e.g. a forward pass that failed)."""
        for lst in (self.parent, self.depth, self._cutoff, self._extra):
            del lst[length:]
        self.n_linear = min(self.n_linear, length)

    def path_to(self, slot: int) -> list[int]:
        """Slots from the root down to `slot`, inclusive."""
        path = []
        while slot != ROOT:
            path.append(slot)
            slot = self.parent[slot]
        return path[::-1]

    def retain(self, slots: Sequence[int]) -> list[int]:
        """Keep only `slots` (closed under ancestors), compacted in order; frees the rest.
        Returns old slot -> new slot for kept slots (-1 for freed)."""
        keep = sorted(set(slots))
        remap = [-1] * self.length
        for new, old in enumerate(keep):
            remap[old] = new
        for old in keep:
            p = self.parent[old]
            if p != ROOT and remap[p] < 0:
                raise TreeError(f"slot {old} kept but its parent {p} is not")
        # Slots before the first gap stay where they are: copy only what moves.
        same = next((i for i, old in enumerate(keep) if old != i), len(keep))
        index = torch.tensor(keep[same:], dtype=torch.long, device=self.k[0].device)
        n = len(keep)
        for layer in range(len(self.k)):
            self.k[layer][:, same:n] = self.k[layer].index_select(1, index)
            self.v[layer][:, same:n] = self.v[layer].index_select(1, index)
        parents = [self.parent[o] for o in keep]
        self.truncate(0)
        for p in parents:  # ancestor-closed, so depths (RoPE positions) are unchanged
            self._append(ROOT if p == ROOT else remap[p])
        return remap

    def _grow(self, needed: int) -> None:
        cap = max(needed, 2 * self.capacity)
        for lst in (self.k, self.v):
            for i, t in enumerate(lst):
                bigger = torch.empty((t.shape[0], cap, t.shape[2]), dtype=t.dtype, device=t.device)
                bigger[:, : self.length] = t[:, : self.length]
                lst[i] = bigger
