"""Tree attention for verification over a paged KV cache (docs/design.md §9).

Queries are the new nodes of a varlen batch of sessions; keys and values live in a paged
pool (fixed-size blocks, one block table per session) that already holds the new nodes'
K/V. Which cached slots a query may see is the verifier's tree mask in compact form:

* every slot below the query's `cutoff` (the committed chain up to its deepest chain
  ancestor, a prefix of the session), and
* the slots of the session's tree region (slots >= `tree_start`) whose bit is set in the
  query's ancestor bitmask (`bits`, int64 words; bit j = slot tree_start + j), which includes
  the query itself - causal within a chain, ancestors-only within a tree.

`tree_masks` builds cutoff and bits on the device from parent pointers (pointer doubling),
so nothing but the parent array crosses from the host. GQA: query head h reads KV head
h // (H / KV). Online softmax (flash-style): memory does not grow with the context.

Reads top to bottom: torch reference, Triton kernel, wrapper, benchmark (`__main__`).
"""

from __future__ import annotations

import math
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference works without Triton
    triton = None


# -- the mask, from parent pointers, on the device ----------------------------------


def tree_masks(region_parents: torch.Tensor, tree_start: int, query_slots: torch.Tensor,
               words: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """For one session: the parent slots [n_tree] int64 of its tree region (slots
    tree_start.., in topological order; -1 for none; slots below tree_start form a chain)
    and the slots of its queries [n] int64. Returns (cutoff [n] int32, bits [n, W] int64)."""
    dev = region_parents.device
    n_tree = region_parents.shape[0]
    W = words if words is not None else max(1, math.ceil(n_tree / 64))
    # Ancestor-or-self bitmasks by pointer doubling: after step s each row holds its
    # ancestors up to distance 2^(s+1) - 1; log2(n) + 1 steps reach the chain.
    idx = torch.arange(n_tree, device=dev)
    bits = torch.zeros(n_tree, W, dtype=torch.int64, device=dev)
    bits[idx, idx // 64] = _bit(idx % 64)
    up = region_parents - tree_start  # [n_tree] parent's region index, < 0: in the chain
    chain_anc = torch.where(up < 0, region_parents, -1)  # deepest chain ancestor, once known
    for _ in range(math.ceil(math.log2(max(n_tree, 2))) + 1):
        has = up >= 0
        safe = up.clamp(min=0)
        bits = torch.where(has[:, None], bits | bits[safe], bits)
        chain_anc = torch.where(has & (chain_anc < 0), chain_anc[safe], chain_anc)
        up = torch.where(has, up[safe], up)
    in_tree = query_slots >= tree_start
    row = (query_slots - tree_start).clamp(0, max(n_tree - 1, 0))
    if n_tree == 0:
        zeros = torch.zeros(len(query_slots), W, dtype=torch.int64, device=dev)
        return (query_slots + 1).to(torch.int32), zeros
    q_bits = torch.where(in_tree[:, None], bits[row], 0)
    cutoff = torch.where(in_tree, chain_anc[row] + 1, query_slots + 1)
    return cutoff.to(torch.int32), q_bits


def _bit(b: torch.Tensor) -> torch.Tensor:
    """1 << b as int64 for b in [0, 64) (bit 63 is the sign bit)."""
    return torch.where(b == 63, torch.full_like(b, -(2**63)), torch.ones_like(b) << b.clamp(max=62))


# -- torch reference ----------------------------------------------------------------------


def dense_mask(cutoff: torch.Tensor, bits: torch.Tensor, tree_start: int, L: int) -> torch.Tensor:
    """The compact mask of n queries (cutoff [n], bits [n, W]) as a dense [n, L] bool."""
    slots = torch.arange(L, device=bits.device)
    j = slots - tree_start
    jj = j.clamp(min=0)
    word = (jj // 64).clamp(max=bits.shape[1] - 1)
    on = ((bits[:, word] >> (jj % 64)) & 1).bool() & (j >= 0)
    return (slots[None, :] < cutoff[:, None].long()) | on


def session_kv(k_pool, v_pool, table_row: torch.Tensor, L: int):
    """k, v [L, KV, D] of one session's slots [0, L), gathered through its block table."""
    bs, KV, D = k_pool.shape[1], k_pool.shape[2], k_pool.shape[3]
    slots = torch.arange(L, device=k_pool.device)
    phys = table_row[slots // bs].long() * bs + slots % bs
    return k_pool.reshape(-1, KV, D)[phys], v_pool.reshape(-1, KV, D)[phys]


def tree_attention_ref(q, k_pool, v_pool, block_table, seq_lens, cu_q, cutoff, tree_start,
                       bits, scale: float) -> torch.Tensor:
    """q [N, H, D]; k_pool/v_pool [blocks, block_size, KV, D]; block_table [S, max_blocks]
    int32; seq_lens [S] (slots to attend over, new nodes included); cu_q [S+1] query offsets;
    cutoff [N] int32; tree_start [S] int32; bits [N, W] int64. Returns o [N, H, D] in q's
    dtype (computed in fp32)."""
    H, KV = q.shape[1], k_pool.shape[2]
    out = torch.empty_like(q)
    for s in range(block_table.shape[0]):
        a, b = int(cu_q[s]), int(cu_q[s + 1])
        if a == b:
            continue
        L = int(seq_lens[s])
        k, v = (t.float() for t in session_kv(k_pool, v_pool, block_table[s], L))  # [L, KV, D]
        allow = dense_mask(cutoff[a:b], bits[a:b], int(tree_start[s]), L)  # [n, L]
        rep = H // KV
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [L, H, D]
        scores = torch.einsum("nhd,lhd->hnl", q[a:b].float(), k) * scale
        scores = scores.masked_fill(~allow[None], float("-inf"))
        out[a:b] = torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v).to(q.dtype)
    return out


# -- Triton kernel --------------------------------------------------------------------


if triton is not None:

    @triton.jit
    def _tree_attn_kernel(
            Q, K, V, Out, BT, SEQ, CUQ, CUT, TSTART, BITS, SCHED_S, SCHED_M,
            scale, W, max_blocks,
            sq_n, sq_h, sk_b, sk_s, sk_h, so_n, so_h,
            H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32: tl.constexpr):
        """One program: BLOCK_M queries of one session x one query head; the key loop runs
        over that session's pages, BLOCK_N (= block size) slots at a time."""
        pid, h = tl.program_id(0), tl.program_id(1)
        s = tl.load(SCHED_S + pid)
        q0 = tl.load(CUQ + s) + tl.load(SCHED_M + pid)
        q_end = tl.load(CUQ + s + 1)
        L = tl.load(SEQ + s)
        t0 = tl.load(TSTART + s)
        kvh = h // (H // KV)
        rows = q0 + tl.arange(0, BLOCK_M)
        rmask = rows < q_end
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        q = tl.load(Q + rows[:, None] * sq_n + h * sq_h + d[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        cut = tl.load(CUT + rows, mask=rmask, other=0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for blk in range(0, tl.cdiv(L, BLOCK_N)):
            phys = tl.load(BT + s * max_blocks + blk)
            cols = blk * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < L
            kv_off = phys * sk_b + tl.arange(0, BLOCK_N)[:, None] * sk_s + kvh * sk_h + d[None, :]
            k = tl.load(K + kv_off, mask=cmask[:, None] & dmask[None, :], other=0.0)
            v = tl.load(V + kv_off, mask=cmask[:, None] & dmask[None, :], other=0.0)
            if FP32:
                qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                qk = tl.dot(q, tl.trans(k))
            qk = qk * scale
            j = cols - t0  # [BLOCK_N] index in the tree region
            jj = tl.maximum(j, 0)
            word = tl.load(BITS + rows[:, None] * W + (jj // 64)[None, :],
                           mask=rmask[:, None] & (j >= 0)[None, :] & cmask[None, :], other=0)
            on = ((word >> (jj % 64).to(tl.int64)[None, :]) & 1) != 0
            allow = (cols[None, :] < cut[:, None]) | (on & (j >= 0)[None, :])
            allow = allow & cmask[None, :] & rmask[:, None]
            qk = tl.where(allow, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(qk - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            if FP32:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        acc = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
        tl.store(Out + rows[:, None] * so_n + h * so_h + d[None, :], acc.to(Out.dtype.element_ty),
                 mask=rmask[:, None] & dmask[None, :])


# -- wrapper ----------------------------------------------------------------------------


def _interpreted() -> bool:
    """Triton's CPU interpreter computes bf16 tl.dot wrongly (Triton 3.9): there, bf16
    inputs are multiplied in fp32 instead; on a GPU they take the native bf16 dot."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def schedule(cu_q: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query blocks of the varlen batch: (session [G] int32, first row in session [G] int32)."""
    n = (cu_q[1:] - cu_q[:-1]).long()
    per = (n + block_m - 1) // block_m  # [S] blocks per session
    sess = torch.repeat_interleave(torch.arange(len(n), device=cu_q.device), per)
    first = torch.cumsum(per, 0) - per
    within = torch.arange(int(per.sum()), device=cu_q.device) - first[sess]
    return sess.to(torch.int32), (within * block_m).to(torch.int32)


def tree_attention(q, k_pool, v_pool, block_table, seq_lens, cu_q, cutoff, tree_start, bits,
                   scale: float, block_m: int = 16) -> torch.Tensor:
    """The Triton path of `tree_attention_ref` (same arguments, same result within fp
    tolerance). Needs k_pool's last dim contiguous and a block size that is a power of 2."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use tree_attention_ref")
    N, H, D = q.shape
    bs, KV = k_pool.shape[1], k_pool.shape[2]
    if H % KV:
        raise ValueError(f"{H} query heads do not group over {KV} KV heads")
    if bs & (bs - 1) or bs < 16:
        raise ValueError(f"block size must be a power of 2 >= 16, got {bs}")
    out = torch.empty_like(q)
    if N == 0:
        return out
    sess, first = schedule(cu_q, block_m)
    bits = bits.contiguous()
    grid = (len(sess), H)
    _tree_attn_kernel[grid](
        q, k_pool, v_pool, out, block_table.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32), cu_q.to(torch.int32), cutoff.to(torch.int32),
        tree_start.to(torch.int32), bits, sess, first, scale, bits.shape[1],
        block_table.shape[1], q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1),
        k_pool.stride(2), out.stride(0), out.stride(1), H=H, KV=KV, D=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_M=block_m, BLOCK_N=bs,
        FP32=q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and _interpreted()))
    return out


# -- benchmark ---------------------------------------------------------------------------


def random_batch(n_sessions: int, ctx: int, tree: int, H: int, KV: int, D: int, bs: int,
                 dtype, device, seed: int = 0):
    """A varlen batch: each session has a chain of ctx slots and a random tree of `tree`
    new nodes, pages shuffled in the pool. Returns the kernel's arguments as a dict."""
    g = torch.Generator().manual_seed(seed)
    per = [(ctx + tree + bs - 1) // bs for _ in range(n_sessions)]
    order = torch.randperm(sum(per), generator=g)
    table = torch.zeros(n_sessions, max(per), dtype=torch.int32)
    at = 0
    for s, p in enumerate(per):
        table[s, :p] = order[at:at + p].to(torch.int32)
        at += p
    k_pool = torch.randn(sum(per), bs, KV, D, generator=g).to(dtype)
    v_pool = torch.randn(sum(per), bs, KV, D, generator=g).to(dtype)
    q = torch.randn(n_sessions * tree, H, D, generator=g).to(dtype)
    cuts, words = [], []
    for _ in range(n_sessions):
        parents = torch.tensor([ctx - 1 + int(torch.randint(0, i + 1, (1,), generator=g))
                                for i in range(tree)])
        c, b = tree_masks(parents, ctx, torch.arange(ctx, ctx + tree), words=max(1, -(-tree // 64)))
        cuts.append(c)
        words.append(b)
    args = dict(q=q, k_pool=k_pool, v_pool=v_pool, block_table=table,
                seq_lens=torch.full((n_sessions,), ctx + tree, dtype=torch.int32),
                cu_q=torch.arange(0, n_sessions * tree + 1, tree, dtype=torch.int32),
                cutoff=torch.cat(cuts), tree_start=torch.full((n_sessions,), ctx, dtype=torch.int32),
                bits=torch.cat(words), scale=D ** -0.5)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def sdpa_with_mask(args: dict) -> torch.Tensor:
    """The same attention through torch SDPA with an explicit dense mask (benchmark rival)."""
    q, bt = args["q"], args["block_table"]
    outs = []
    for s in range(bt.shape[0]):
        a, b = int(args["cu_q"][s]), int(args["cu_q"][s + 1])
        L = int(args["seq_lens"][s])
        k, v = session_kv(args["k_pool"], args["v_pool"], bt[s], L)
        mask = dense_mask(args["cutoff"][a:b], args["bits"][a:b], int(args["tree_start"][s]), L)
        o = torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=mask[None, None], enable_gqa=q.shape[1] != k.shape[1],
            scale=args["scale"])
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


if __name__ == "__main__" and triton is not None:
    @triton.testing.perf_report(triton.testing.Benchmark(
        x_names=["ctx"], x_vals=[1024, 4096, 16384, 32768], line_arg="impl",
        line_vals=["triton", "sdpa", "torch"], line_names=["Triton", "SDPA+mask", "torch ref"],
        ylabel="ms", plot_name="tree-attention-8B-GQA-32x8x128-8sessions-tree32",
        args=dict(sessions=8, tree=32)))
    def bench(ctx, impl, sessions, tree):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        a = random_batch(sessions, ctx, tree, 32, 8, 128, 16, torch.bfloat16, device)
        fn = {"triton": lambda: tree_attention(**a), "sdpa": lambda: sdpa_with_mask(a),
              "torch": lambda: tree_attention_ref(**a)}[impl]
        return triton.testing.do_bench(fn)

    bench.run(print_data=True)
