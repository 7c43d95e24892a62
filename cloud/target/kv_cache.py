"""A per-sequence KV cache whose slots form a tree, stored in a shared paged pool.

Slots are appended in topological order (a parent always has a lower slot than its
children). The attention pattern is encoded cheaply: slots [0, n_linear) are a chain
(slot i's parent is i-1) and every node sees the chain up to its deepest chain ancestor
(`cutoff`), plus an explicit set of its ancestors among the tree slots beyond the chain.

Storage is paged (docs/design.md §9, §11): every sequence of a model takes fixed-size
blocks from one `PagePool` ([blocks, block_size, kv_heads, head_dim] per layer) and keeps a
block table, so one kernel launch can attend over many sessions' caches; blocks return to the pool when a
sequence shrinks (commit) or is dropped.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import weakref
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


@dataclass
class SeqPass:
    """One sequence's part of a forward pass in pool rows: all a rank needs to attend
    (a tensor-parallel rank holds the pool's storage but none of the caches)."""

    n: int  # new nodes
    write_rows: torch.Tensor  # [n] int64 pool rows (of PagePool.flat) the new nodes fill
    read_rows: torch.Tensor  # [end] int64 pool rows of slots [0, end), end = start + n
    mask: torch.Tensor  # [n, end] bool, True = may attend
    last_only: bool = False  # logits for the last node only


class PagePool:
    """Fixed-size KV blocks shared by the sequences of one model: per layer
    k, v [n_blocks, block_size, n_kv_heads, head_dim]. Grows by doubling when full and
    halves again when most of it is free (down to its initial size); thread-safe.

    The storage is always made of normal tensors, never inference tensors, whatever mode
    the caller runs in: the pool grows inside `forward_batch` (under inference mode) and is
    written outside it (a commit's `retain`), and an inference tensor refuses in-place
    updates outside inference mode."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", block_size: int = 16, n_blocks: int = 64,
                 mirror=None):
        self.block_size, self.num_layers = block_size, num_layers
        # mirror(op): told every change of the storage's shape or rows outside a pass,
        # ("resize", n_blocks) or ("copy", dst, src), so tensor-parallel ranks can replay it.
        self.mirror = mirror
        self.min_blocks = n_blocks  # the pool never shrinks below its initial size
        shape = (n_blocks, block_size, num_kv_heads, head_dim)
        with torch.inference_mode(False):
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # A min-heap: the lowest free ids are handed out first, so live blocks gather at
        # the start of the pool and the free end can be trimmed.
        self.free_blocks = list(range(n_blocks))
        self._returned: list[int] = []  # freed blocks not yet filed in the heap
        self._busy = False
        self.lock = threading.RLock()

    @property
    def n_blocks(self) -> int:
        return self.k[0].shape[0]

    def __deepcopy__(self, memo) -> PagePool:
        """A copied model gets an empty pool of its own (sequences are not copied)."""
        k = self.k[0]
        return PagePool(self.num_layers, k.shape[2], k.shape[3], k.dtype, k.device,
                        self.block_size, self.min_blocks)

    def replay(self, op: tuple) -> None:
        """Apply an op another rank's pool reported to its mirror."""
        if op[0] == "resize":
            self._resize(op[1])
        elif op[0] == "copy":
            dev = self.k[0].device
            self.copy_rows(op[1].to(dev), op[2].to(dev))
        else:
            raise ValueError(f"unknown pool op {op[0]!r}")

    def alloc(self, n: int) -> list[int]:
        with self.lock, self._operation():
            while len(self.free_blocks) < n:
                self._grow()
            return [heapq.heappop(self.free_blocks) for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        """Take blocks back (and clear the caller's list); may trim the pool."""
        with self.lock:
            self._returned.extend(blocks)
            blocks.clear()
            if self._busy:
                return  # re-entered by a finalizer that GC ran mid-operation: it settles them
            with self._operation():
                pass

    @contextlib.contextmanager
    def _operation(self):
        """Mark the pool busy; afterwards file every returned block and trim. A cache's
        finalizer (weakref, run by GC at any allocation) may call `free` inside another
        pool operation on this thread; the lock is reentrant, so it only queues."""
        self._busy = True
        try:
            yield
        finally:
            while self._returned:
                while self._returned:
                    heapq.heappush(self.free_blocks, self._returned.pop())
                self._trim()
            self._busy = False

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v of a layer viewed as [n_blocks * block_size, n_kv, head_dim]."""
        k, v = self.k[layer], self.v[layer]
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [n, n_kv, hd] at pool rows [n] int64."""
        with self.lock:
            fk, fv = self.flat(layer)
            fk[rows], fv[rows] = k, v

    def read(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of k, v [n_kv, n, hd] at pool rows [n] int64 (the reference attention)."""
        with self.lock:
            fk, fv = self.flat(layer)
            return fk[rows].transpose(0, 1), fv[rows].transpose(0, 1)

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy pool rows src [n] int64 to rows dst [n] int64 (of `flat`) in every layer."""
        if self.mirror:
            self.mirror(("copy", dst.cpu(), src.cpu()))
        with self.lock, torch.inference_mode():
            for layer in range(self.num_layers):
                fk, fv = self.flat(layer)
                fk[dst], fv[dst] = fk[src], fv[src]

    def _grow(self) -> None:
        old = self.n_blocks
        self._resize(2 * old)
        for b in range(old, 2 * old):
            heapq.heappush(self.free_blocks, b)

    def _trim(self) -> None:
        """Halve the pool while its upper three quarters are free (so a regrow needs the
        live blocks to double first: no grow/shrink flapping)."""
        n = self.n_blocks
        if n <= self.min_blocks or 4 * len(self.free_blocks) < 3 * n:
            return
        free = set(self.free_blocks)
        top = next((b + 1 for b in range(n - 1, -1, -1) if b not in free), 0)
        new = n
        while new > self.min_blocks and 4 * top <= new:
            new //= 2
        if new < n:
            self._resize(new)
            self.free_blocks = [b for b in self.free_blocks if b < new]
            heapq.heapify(self.free_blocks)

    def _resize(self, n_blocks: int) -> None:
        """Reallocate every layer's k, v with n_blocks blocks, keeping blocks [0, min)."""
        keep = min(n_blocks, self.n_blocks)
        if self.mirror:
            self.mirror(("resize", n_blocks))
        with torch.inference_mode(False):
            for lst in (self.k, self.v):
                for i, t in enumerate(lst):
                    new = t.new_zeros((n_blocks, *t.shape[1:]))
                    new[:keep] = t[:keep]
                    lst[i] = new


class KVCache:
    """Keys/values of one sequence: slots in blocks of a PagePool (its own, if none given)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", capacity: int = 256,
                 pool: PagePool | None = None):
        self.pool = pool or PagePool(num_layers, num_kv_heads, head_dim, dtype, device,
                                     n_blocks=max(1, -(-capacity // 16)))
        self.device = self.pool.k[0].device
        self.blocks: list[int] = []  # block table: slot s lives in blocks[s // block_size]
        self._set_blocks()
        weakref.finalize(self, self.pool.free, self.blocks)  # blocks go back when dropped
        self.parent: list[int] = []  # [length] parent slot, ROOT for none
        self.depth: list[int] = []  # [length] RoPE position
        self._cutoff: list[int] = []  # [length] chain slots < cutoff are ancestors-or-self
        self._extra: list[frozenset[int]] = []  # [length] tree ancestors-or-self beyond the chain
        self.n_linear = 0
        self._reserve(capacity)

    @property
    def length(self) -> int:
        return len(self.parent)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.pool.block_size

    def nbytes(self) -> int:
        k = self.pool.k[0]
        return 2 * self.pool.num_layers * self.length * k[0, 0].numel() * k.element_size()

    @property
    def block_table(self) -> torch.Tensor:
        """[n_blocks] int64 on the device."""
        return self._table

    def slots_to_flat(self, slots: torch.Tensor) -> torch.Tensor:
        """Pool rows (of PagePool.flat) of slots [n] int64."""
        return self._rows[slots]

    def release(self) -> None:
        """Return every block to the pool (the cache is empty afterwards)."""
        self.truncate(0)
        self.pool.free(self.blocks)
        self._set_blocks()

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
            self._reserve(max(start + n_new, 2 * self.capacity))
        for p in parents:
            self._append(int(p))
        device = self.device
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

    def seq_pass(self, plan: Plan, n: int, last_only: bool = False) -> SeqPass:
        """The pool rows of a planned pass of n new nodes."""
        end = plan.start + n
        return SeqPass(n, self._rows[plan.start:end], self._rows[:end], plan.mask, last_only)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [n_new, n_kv, hd] at slots [start, start+n_new)."""
        self.pool.write(layer, self._rows[start:start + k.shape[0]], k, v)

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of k, v [n_kv, end, hd] of slots [0, end)."""
        return self.pool.read(layer, self._rows[:end])

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
        n = len(keep)
        src = self.slots_to_flat(torch.tensor(keep[same:], dtype=torch.long, device=self.device))
        self.pool.copy_rows(self._rows[same:n], src)
        parents = [self.parent[o] for o in keep]
        self.truncate(0)
        for p in parents:  # ancestor-closed, so depths (RoPE positions) are unchanged
            self._append(ROOT if p == ROOT else remap[p])
        if self.capacity > 2 * self.length + 2 * self.pool.block_size:
            self.shrink()  # a long branch was dropped: its blocks serve other sessions
        return remap

    def _set_blocks(self) -> None:
        """Refresh the block table and the pool row of every slot (once per change of the
        blocks, so writes and reads of every layer only slice)."""
        bs = self.pool.block_size
        self._table = torch.tensor(self.blocks, dtype=torch.long, device=self.device)
        self._rows = (self._table[:, None] * bs + torch.arange(bs, device=self.device)).flatten()

    def _reserve(self, slots: int) -> None:
        """Own enough blocks for `slots` slots."""
        need = -(-slots // self.pool.block_size) - len(self.blocks)
        if need > 0:
            self.blocks.extend(self.pool.alloc(need))
            self._set_blocks()

    def shrink(self) -> None:
        """Give back the blocks past the last slot (after a commit)."""
        keep = max(1, -(-self.length // self.pool.block_size))
        if len(self.blocks) > keep:
            extra = self.blocks[keep:]
            del self.blocks[keep:]
            self.pool.free(extra)
            self._set_blocks()
