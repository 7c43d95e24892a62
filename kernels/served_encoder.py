"""The fused served-distribution encoder: logits of scored nodes -> what the downlink needs.

For each node (row of logits [n, V]) with the session's sampling parameters: temperature ->
top-k (k <= k_max) -> softmax -> top-p -> uint16 units by largest remainder (sum 65536),
support sorted by units (ties: lower id), the sent prefix reaching `send_mass`, the tail mass,
m pre-drawn tail samples (inverse CDF over the tail with uniforms the host draws from the
node's counter-based stream, turned into samples exactly as the shared `tail_draws` does), and `self_p` of each
node's token under its parent. Semantics: `acespec.shared.served` (the reference).

The top-k never sorts the vocabulary: a bisection on the float's bit pattern finds the
k-th largest logit in 32 counting passes over the row, one compaction pass gathers the
k candidates, and only those (<= k_max, a power-of-2 block) are sorted, in fp64.

Reads top to bottom: torch/numpy reference, Triton kernels, wrapper, benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from acespec.shared.served import (
    UNITS,
    ServeParams,
    n_sent,
    served,
    tail_draws,
    tail_uniforms,
)

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


@dataclass
class Encoded:
    """Per node, on the host: support in served order (units desc, ids asc on ties)."""

    ids: np.ndarray  # [n, KMAX] int64, -1 past count
    units: np.ndarray  # [n, KMAX] int64, 0 past count
    count: np.ndarray  # [n] support size
    n_sent: np.ndarray  # [n]
    tail_units: np.ndarray  # [n]
    tail_ids: np.ndarray  # [n, m] pre-drawn tail samples (-1 when the tail is empty)
    tail_sample_units: np.ndarray  # [n, m]
    self_units: np.ndarray  # [n] p~(node token | parent) for in-batch parents, else 0


def first_tail_uniforms(seed: int, positions, m: int) -> np.ndarray:
    """[n, m] float64: the first m uniforms of each node's tail stream (what the shared
    `tail_draws` turns into its first m samples)."""
    return np.stack([tail_uniforms(seed, int(p), 0, m) for p in positions]) if m else \
        np.zeros((len(positions), 0))


# -- reference ----------------------------------------------------------------------------


def encode_ref(logits: torch.Tensor, params: ServeParams, seed: int, positions, tokens,
               parent_rows, kmax: int = 64) -> Encoded:
    """The reference: `served` per row, then the sent prefix, tail and self_p."""
    rows = logits.float().cpu().numpy()
    n, m = len(rows), params.tail_samples
    out = Encoded(np.full((n, kmax), -1), np.zeros((n, kmax), np.int64), np.zeros(n, np.int64),
                  np.zeros(n, np.int64), np.zeros(n, np.int64), np.full((n, m), -1),
                  np.zeros((n, m), np.int64), np.zeros(n, np.int64))
    dists = [served(r, params) for r in rows]
    for i, d in enumerate(dists):
        c = len(d.ids)
        out.ids[i, :c], out.units[i, :c], out.count[i] = d.ids, d.units, c
        s = n_sent(d, params.send_mass)
        out.n_sent[i], out.tail_units[i] = s, int(d.units[s:].sum())
        if c > s and m:
            out.tail_ids[i], out.tail_sample_units[i] = tail_draws(d, s, seed, int(positions[i]),
                                                                   0, m)
        if parent_rows[i] >= 0:
            out.self_units[i] = dists[parent_rows[i]].units_of(int(tokens[i]))
    return out


# -- Triton kernels ---------------------------------------------------------------------


if triton is not None:

    @triton.jit
    def _ordered(x):
        """float32 -> int32 whose signed order is the float order (NaN-free input)."""
        b = x.to(tl.int32, bitcast=True)
        return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)

    @triton.jit
    def _select_topk(L, CAND, row, V, k, BLOCK: tl.constexpr):
        """Write the ids of the k largest logits of row (ties: lower id) to CAND[row, :k]."""
        lo = tl.full([], -2147483648, tl.int64)  # count(ordered >= lo) >= k always
        hi = tl.full([], 2147483647, tl.int64) + 1  # count(>= hi) = 0 < k
        for _ in range(33):  # bisection for the largest t with count(ordered >= t) >= k
            mid = (lo + hi) // 2
            cnt = tl.zeros([], tl.int32)
            for off in range(0, V, BLOCK):
                c = off + tl.arange(0, BLOCK)
                x = tl.load(L + row * V + c, mask=c < V, other=float("-inf"))
                cnt += tl.sum(((_ordered(x).to(tl.int64) >= mid) & (c < V)).to(tl.int32), 0)
            ok = cnt >= k
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid)
        thr = lo  # the k-th largest value, ordered
        n_gt = tl.zeros([], tl.int32)
        for off in range(0, V, BLOCK):
            c = off + tl.arange(0, BLOCK)
            x = tl.load(L + row * V + c, mask=c < V, other=float("-inf"))
            n_gt += tl.sum(((_ordered(x).to(tl.int64) > thr) & (c < V)).to(tl.int32), 0)
        eq_left = k - n_gt  # ties at the threshold taken lowest id first
        at = tl.zeros([], tl.int32)
        for off in range(0, V, BLOCK):
            c = off + tl.arange(0, BLOCK)
            o = _ordered(tl.load(L + row * V + c, mask=c < V, other=float("-inf"))).to(tl.int64)
            eq = (o == thr) & (c < V)
            eq_rank = tl.cumsum(eq.to(tl.int32), 0) - 1
            take = ((o > thr) & (c < V)) | (eq & (eq_rank < eq_left))
            pos = at + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(CAND + row * 4096 + pos, c, mask=take)
            eq_left -= tl.sum(eq.to(tl.int32), 0)
            at += tl.sum(take.to(tl.int32), 0)

    @triton.jit
    def _encode_kernel(L, CAND, IDS, UNI, CNT, NSENT, TAILU, U, TID, TUNI,
                       V, k, temp, top_p, send_units, m,
                       KMAX: tl.constexpr, BLOCK: tl.constexpr, MS: tl.constexpr):
        row = tl.program_id(0)
        _select_topk(L, CAND, row, V, k, BLOCK)
        j = tl.arange(0, KMAX)
        valid = j < k
        cid = tl.load(CAND + row * 4096 + j, mask=valid, other=0)
        x = tl.load(L + row * V + cid, mask=valid, other=float("-inf")).to(tl.float64)
        # Sort the k candidates: descending logit, lower id first (a 64-bit packed key).
        key = (_ordered(x.to(tl.float32)).to(tl.int64) << 32) | (2147483647 - cid).to(tl.int64)
        key = tl.where(valid, key, -9223372036854775807 - 1)
        key = tl.sort(key, 0, descending=True)
        sid = 2147483647 - (key & 0xFFFFFFFF)
        sx = tl.load(L + row * V + sid, mask=valid, other=float("-inf")).to(tl.float64)
        x0 = tl.max(tl.where(valid, sx, -1e300), 0)
        e = tl.where(valid, tl.exp((sx - x0) / temp), 0.0)
        p = e / tl.sum(e, 0)
        keep = valid & ((tl.cumsum(p, 0) - p) < top_p)
        p = tl.where(keep, p, 0.0)
        # Largest remainder to UNITS (remainder desc, earlier first).
        scaled = p / tl.sum(p, 0) * 65536.0
        fl = tl.floor(scaled)
        short = 65536 - tl.sum(fl, 0).to(tl.int64)
        rem_key = (((scaled - fl) * 1099511627776.0).to(tl.int64) << 13) | (KMAX - j).to(tl.int64)
        rem_key = tl.where(keep, rem_key, -1)
        srt = tl.sort(rem_key, 0, descending=True)
        rank_of = _rank(rem_key, srt, KMAX)
        units = fl.to(tl.int64) + ((rank_of < short) & keep).to(tl.int64)
        # Support order: units desc, then id asc (quantisation can reorder near-ties).
        okey = (units << 32) | (2147483647 - sid).to(tl.int64)
        okey = tl.where(units > 0, okey, -1)
        okey = tl.sort(okey, 0, descending=True)
        oun = okey >> 32
        oid = 2147483647 - (okey & 0xFFFFFFFF)
        live = okey >= 0
        count = tl.sum(live.to(tl.int32), 0)
        tl.store(IDS + row * KMAX + j, tl.where(live, oid, -1))
        tl.store(UNI + row * KMAX + j, tl.where(live, oun, 0))
        tl.store(CNT + row, count)
        cum = tl.cumsum(tl.where(live, oun, 0), 0).to(tl.float64)
        s = tl.minimum(tl.sum((cum < send_units).to(tl.int32), 0) + 1, count)
        tl.store(NSENT + row, s)
        tail = live & (j >= s)
        tu = tl.where(tail, oun, 0)
        tail_total = tl.sum(tu, 0)
        tl.store(TAILU + row, tail_total)
        # Tail draws as tail_draws: searchsorted(cumsum(p) / cdf[-1], u, 'right').
        cdf = tl.cumsum(tu.to(tl.float64) / tl.maximum(tail_total, 1).to(tl.float64), 0)
        last = tl.max(tl.where(tail, cdf, 0.0), 0)
        cdf = cdf / tl.where(last > 0, last, 1.0)
        for i in tl.static_range(MS):
            if i < m:
                u = tl.load(U + row * MS + i)
                pick = s + tl.sum((tail & (cdf <= u)).to(tl.int32), 0)
                pick = tl.minimum(pick, count - 1)
                hit = j == pick
                zi = tl.sum(tl.where(hit, oid, 0), 0)
                zu = tl.sum(tl.where(hit, oun, 0), 0)
                has = tail_total > 0
                tl.store(TID + row * MS + i, tl.where(has, zi, -1))
                tl.store(TUNI + row * MS + i, tl.where(has, zu, 0))

    @triton.jit
    def _rank(keys, sorted_keys, KMAX: tl.constexpr):
        """Position of each (unique) key in sorted_keys (descending)."""
        return tl.sum((sorted_keys[None, :] > keys[:, None]).to(tl.int32), 1)

    @triton.jit
    def _self_units_kernel(IDS, UNI, PROW, TOK, OUT, KMAX: tl.constexpr):
        """p~(token | parent row) in units, 0 when the parent is not in the batch."""
        i = tl.program_id(0)
        pr = tl.load(PROW + i)
        tok = tl.load(TOK + i)
        j = tl.arange(0, KMAX)
        ids = tl.load(IDS + tl.maximum(pr, 0) * KMAX + j)
        un = tl.load(UNI + tl.maximum(pr, 0) * KMAX + j)
        val = tl.sum(tl.where(ids == tok, un, 0), 0)
        tl.store(OUT + i, tl.where(pr >= 0, val, 0))


# -- wrapper ------------------------------------------------------------------------------


def encode(logits: torch.Tensor, params: ServeParams, seed: int, positions, tokens,
           parent_rows, kmax: int = 64, block: int = 1024) -> Encoded:
    """The Triton path of `encode_ref` (sampled sessions; greedy needs only an argmax).
    logits [n, V] on the device; positions/tokens/parent_rows [n] host ints."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use encode_ref")
    s = params.sampling
    if s.greedy:
        raise ValueError("greedy sessions send an argmax; the encoder is for sampling")
    n, V = logits.shape
    k = min(params.k, V)
    if k > kmax or kmax & (kmax - 1):
        raise ValueError(f"k={k} needs kmax >= k, a power of 2 (got {kmax})")
    dev = logits.device
    m = params.tail_samples
    ms = max(1, m)
    x = logits.float().contiguous()
    cand = torch.zeros(n, 4096, dtype=torch.int32, device=dev)
    ids = torch.empty(n, kmax, dtype=torch.int64, device=dev)
    uni = torch.empty(n, kmax, dtype=torch.int64, device=dev)
    cnt = torch.empty(n, dtype=torch.int32, device=dev)
    nsent = torch.empty(n, dtype=torch.int32, device=dev)
    tailu = torch.empty(n, dtype=torch.int64, device=dev)
    u = torch.zeros(n, ms, dtype=torch.float64)
    if m:
        u[:, :m] = torch.from_numpy(first_tail_uniforms(seed, positions, m))
    u = u.to(dev)
    tid = torch.full((n, ms), -1, dtype=torch.int64, device=dev)
    tuni = torch.zeros(n, ms, dtype=torch.int64, device=dev)
    _encode_kernel[(n,)](x, cand, ids, uni, cnt, nsent, tailu, u, tid, tuni, V, k,
                         float(s.temperature), s.top_p if s.top_p < 1.0 else 2.0,
                         params.send_mass * UNITS - 1e-9, m, KMAX=kmax, BLOCK=block, MS=ms)
    prow = torch.as_tensor(np.asarray(parent_rows, dtype=np.int64), device=dev)
    tok = torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=dev)
    selfu = torch.empty(n, dtype=torch.int64, device=dev)
    _self_units_kernel[(n,)](ids, uni, prow, tok, selfu, KMAX=kmax)
    h = [t.cpu().numpy() for t in (ids, uni, cnt, nsent, tailu, tid, tuni, selfu)]
    return Encoded(h[0], h[1], h[2].astype(np.int64), h[3].astype(np.int64), h[4],
                   h[5][:, :m], h[6][:, :m], h[7])


# -- benchmark --------------------------------------------------------------------------


if __name__ == "__main__" and triton is not None:
    from acespec.shared.config import SamplingParams

    @triton.testing.perf_report(triton.testing.Benchmark(
        x_names=["nodes"], x_vals=[8, 32, 64, 256], line_arg="impl",
        line_vals=["triton", "reference"], line_names=["Triton", "numpy reference"],
        ylabel="ms", plot_name="served-encoder-vocab-151936", args=dict(V=151_936)))
    def bench(nodes, impl, V):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        logits = torch.randn(nodes, V, device=device) * 3
        p = ServeParams(SamplingParams(temperature=0.8, top_k=50, top_p=0.95), k_max=64)
        args = (logits, p, 0, list(range(nodes)), [0] * nodes, [-1] * nodes)
        fn = (lambda: encode(*args)) if impl == "triton" else (lambda: encode_ref(*args))
        return triton.testing.do_bench(fn)

    bench.run(print_data=True)
