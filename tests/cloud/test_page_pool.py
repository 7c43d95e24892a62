"""The verifier's paged KV storage: blocks shared by sequences, returned on commit and drop,
data intact when the pool grows."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from acespec.cloud.target.kv_cache import KVCache, PagePool  # noqa: E402


def test_sequences_share_blocks_and_give_them_back():
    pool = PagePool(2, 2, 8, torch.float32, block_size=16, n_blocks=4)
    a = KVCache(2, 2, 8, torch.float32, capacity=16, pool=pool)
    b = KVCache(2, 2, 8, torch.float32, capacity=16, pool=pool)
    assert len(pool.free_blocks) == 2 and not set(a.blocks) & set(b.blocks)
    a.plan(None, 40)  # takes the 2 free blocks
    assert len(a.blocks) == 3 and pool.n_blocks == 4 and not pool.free_blocks
    k = torch.randn(40, 2, 8)
    a.write(1, 0, k, -k)
    big = KVCache(2, 2, 8, torch.float32, capacity=16 * 6, pool=pool)  # the pool doubles twice
    assert pool.n_blocks == 16  # and a's blocks kept their ids and data:
    keys, values = a.read(1, 40)
    assert torch.equal(keys, k.transpose(0, 1)) and torch.equal(values, -k.transpose(0, 1))
    free = len(pool.free_blocks)
    a.retain(list(range(5)))  # a commit that drops most of the sequence
    assert len(a.blocks) == 1 and len(pool.free_blocks) > free
    assert torch.equal(a.read(1, 5)[0], k[:5].transpose(0, 1))
    big.release()
    del b
    gc.collect()
    assert len(pool.free_blocks) == pool.n_blocks - len(a.blocks)


def test_retain_moves_kept_slots_across_blocks():
    pool = PagePool(1, 1, 4, torch.float32, block_size=16, n_blocks=2)
    c = KVCache(1, 1, 4, torch.float32, capacity=16, pool=pool)
    c.plan(None, 20)
    c.plan([19, 19, 21], 3)  # slots 20..22: a small tree
    k = torch.arange(23 * 4, dtype=torch.float32).view(23, 1, 4)
    c.write(0, 0, k, k)
    remap = c.retain(list(range(20)) + [21, 22])  # drop slot 20, a sibling branch
    assert remap[20] == -1 and remap[21] == 20 and remap[22] == 21
    keys = c.read(0, c.length)[0][0]
    assert torch.equal(keys[20], k[21, 0]) and torch.equal(keys[21], k[22, 0])
    assert torch.equal(keys[:20], k[:20, 0])


def test_a_pool_grown_under_inference_mode_stays_writable_outside_it():
    """forward_batch grows the pool under torch.inference_mode; a commit's retain writes it
    outside that mode: the storage must never become inference tensors."""
    pool = PagePool(1, 1, 4, torch.float32, block_size=16, n_blocks=1)
    c = KVCache(1, 1, 4, torch.float32, capacity=16, pool=pool)
    k = torch.arange(41 * 4, dtype=torch.float32).view(41, 1, 4)
    with torch.inference_mode():
        c.plan(None, 40)  # 3 blocks: the pool doubles twice in this mode
        c.plan([9], 1)  # slot 40 branches off slot 9
        c.write(0, 0, k, k)
    assert pool.n_blocks == 4 and not pool.k[0].is_inference()
    c.retain(list(range(10)) + [40])  # moves slot 40 to 10, outside inference mode
    assert torch.equal(c.read(0, 11)[0][0], torch.cat([k[:10, 0], k[40:, 0]]))


def test_pool_shrinks_when_mostly_free_and_keeps_live_data():
    pool = PagePool(1, 1, 4, torch.float32, block_size=16, n_blocks=4)
    small = KVCache(1, 1, 4, torch.float32, capacity=16, pool=pool)
    small.plan(None, 16)
    k = torch.randn(16, 1, 4)
    small.write(0, 0, k, k)
    big = KVCache(1, 1, 4, torch.float32, capacity=16 * 60, pool=pool)
    assert pool.n_blocks == 64
    other = KVCache(1, 1, 4, torch.float32, capacity=16 * 20, pool=pool)  # blocks 61..80
    big.release()  # 60 of 128 blocks free, but the live top is at 81: no shrink
    assert pool.n_blocks == 128
    del other
    gc.collect()  # a dropped cache's finalizer gives its blocks back, and the pool trims
    assert pool.n_blocks == 4 and sorted(pool.free_blocks) == [1, 2, 3]
    assert torch.equal(small.read(0, 16)[0], k.transpose(0, 1))
    again = KVCache(1, 1, 4, torch.float32, capacity=16 * 3, pool=pool)  # fits: no regrow
    assert pool.n_blocks == 4 and again.blocks == [1, 2, 3]
