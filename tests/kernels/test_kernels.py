"""Triton kernels on the CPU (TRITON_INTERPRET=1, set in conftest) against their references:
irregular shapes, several sessions, deep and wide trees, GQA 1/4/8, page boundaries; and the
ancestor masks against the verifier's own KV-cache mask (an independent implementation)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from acespec.cloud.target.kv_cache import KVCache  # noqa: E402
from acespec.kernels.served_encoder import encode, encode_ref  # noqa: E402
from acespec.kernels.tree_attention import (  # noqa: E402
    dense_mask,
    random_batch,
    sdpa_with_mask,
    tree_attention,
    tree_attention_ref,
    tree_masks,
)
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}  # max |diff| of outputs


@pytest.mark.parametrize("seed", range(6))
def test_tree_masks_equal_the_verifier_cache_mask(seed):
    """Random trees grown over several passes (chains, branches off earlier passes' nodes,
    regions wider than 64 nodes): the pointer-doubling masks equal KVCache.plan's masks."""
    rng = np.random.default_rng(seed)
    cache = KVCache(1, 1, 4, torch.float32, capacity=8)
    cache.plan(None, int(rng.integers(1, 40)))  # a committed chain
    for _ in range(4):
        n = int(rng.integers(1, 40))
        start = cache.length
        parents = [int(rng.integers(max(0, start - 60), start + i)) for i in range(n)]
        plan = cache.plan(parents, n)
        par = torch.tensor(cache.parent[cache.n_linear:], dtype=torch.long)
        cutoff, bits = tree_masks(par, cache.n_linear, torch.arange(start, start + n))
        got = dense_mask(cutoff, bits, cache.n_linear, start + n)
        assert torch.equal(got, plan.mask), (seed, start, n)


CASES = [  # sessions, ctx, tree, H, KV, D, block, dtype
    (1, 1, 1, 4, 4, 16, 16, torch.float32),  # one token, MHA
    (3, 37, 21, 8, 2, 24, 16, torch.float32),  # odd sizes, GQA 4, head dim 24
    (2, 32, 16, 8, 1, 32, 16, torch.float32),  # ctx on a page boundary, GQA 8
    (4, 33, 70, 8, 8, 16, 32, torch.float32),  # wide trees: 2 bitmask words, block 32
    (2, 15, 9, 16, 2, 64, 16, torch.float16),
    (3, 47, 33, 8, 2, 32, 16, torch.bfloat16),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:7])) + str(c[7])[-4:])
def test_tree_attention_matches_reference(case):
    S, ctx, tree, H, KV, D, bs, dt = case
    a = random_batch(S, ctx, tree, H, KV, D, bs, dt, "cpu", seed=S * 7 + ctx)
    ref = tree_attention_ref(**a)
    got = tree_attention(**a)
    err = (got.float() - ref.float()).abs().max().item()
    assert err <= TOL[dt], err
    assert (sdpa_with_mask(a).float() - ref.float()).abs().max().item() <= TOL[dt]


def test_tree_attention_deep_chain_and_unequal_sessions():
    """A 45-deep chain of new nodes in one session beside a 3-node star in another, pages
    out of order: causal within the chain, ancestors-only in the star."""
    g = torch.Generator().manual_seed(3)
    H, KV, D, bs = 4, 2, 16, 16
    specs = [(20, [19 + i for i in range(45)]), (50, [49, 49, 49])]  # (ctx, parents)
    pages, table_rows, cuts, bits, lens = 0, [], [], [], []
    for ctx, parents in specs:
        L = ctx + len(parents)
        n_pages = -(-L // bs)
        table_rows.append(list(range(pages, pages + n_pages))[::-1])
        pages += n_pages
        c, b = tree_masks(torch.tensor(parents), ctx, torch.arange(ctx, L), words=1)
        cuts.append(c)
        bits.append(b)
        lens.append(L)
    width = max(len(r) for r in table_rows)
    table = torch.tensor([r + [0] * (width - len(r)) for r in table_rows], dtype=torch.int32)
    n = sum(len(p) for _, p in specs)
    a = dict(q=torch.randn(n, H, D, generator=g), k_pool=torch.randn(pages, bs, KV, D, generator=g),
             v_pool=torch.randn(pages, bs, KV, D, generator=g), block_table=table,
             seq_lens=torch.tensor(lens, dtype=torch.int32),
             cu_q=torch.tensor([0, 45, 48], dtype=torch.int32), cutoff=torch.cat(cuts),
             tree_start=torch.tensor([20, 50], dtype=torch.int32), bits=torch.cat(bits),
             scale=D ** -0.5)
    assert (tree_attention(**a) - tree_attention_ref(**a)).abs().max().item() <= 2e-5


ENCODER_CASES = [  # V, temperature, top_k, top_p, send_mass, tail samples
    (1000, 1.0, 0, 1.0, 0.9, 2),
    (777, 0.7, 20, 0.9, 0.5, 3),
    (4096, 1.3, 64, 0.95, 0.8, 4),
    (300, 0.5, 5, 1.0, 1.0, 1),
    (129, 2.0, 0, 0.5, 0.3, 0),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", ENCODER_CASES, ids=lambda c: f"V{c[0]}-k{c[2]}-p{c[3]}")
def test_served_encoder_equals_reference(case):
    """Every output equal to the numpy reference: ids, units (exact), support size, sent
    prefix, tail mass, tail samples and self_p - with tied logits in the mix."""
    V, T, k, tp, sm, m = case
    g = torch.Generator().manual_seed(V)
    n = 7
    logits = torch.randn(n, V, generator=g) * 2
    logits[2, : min(50, V)] = 1.5  # a block of exact ties around the top
    logits[4] = 0.0  # all tied
    p = ServeParams(SamplingParams(temperature=T, top_k=k, top_p=tp), send_mass=sm,
                    tail_samples=m)
    pos = list(range(10, 10 + n))
    toks = torch.randint(0, V, (n,), generator=g).tolist()
    toks[1] = int(logits[0].argmax())  # in the parent's support
    parents = [-1] + list(range(n - 1))
    got = encode(logits, p, 5, pos, toks, parents)
    ref = encode_ref(logits, p, 5, pos, toks, parents)
    for f in ("ids", "units", "count", "n_sent", "tail_units", "tail_ids",
              "tail_sample_units", "self_units"):
        assert np.array_equal(getattr(got, f), getattr(ref, f)), f
    assert got.self_units[1] > 0


@pytest.mark.slow
def test_gpucheck_script_runs_in_the_interpreter(tmp_path):
    """The GPU check script's own code path, on tiny shapes (no GPU here)."""
    import json

    from acespec.kernels.gpucheck import main

    out = tmp_path / "rows.json"
    assert main(["--cpu-smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["kernel"] for r in rows} == {"tree_attention", "served_encoder"}
    assert all(r["ok"] for r in rows)
