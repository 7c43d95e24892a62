"""`acespec cloud profile`: the target's pass time against the nodes it scores, on one
device and tensor-parallel side by side, with the all-reduce bytes a pass moves.

Each pass scores a chain of n new nodes after a `context`-token prefix (the KV cache
holds the prefix; the nodes are dropped again after the pass, as rejected drafts are),
timed as the verifier's batcher runs it (`forward_batch`, logits on the host). A random
model of a named shape (`--random llama-8b`) needs no checkpoint, for GPU profiles of
shapes larger than the shipped targets (one device only: ranks load checkpoints).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from acespec.cloud.target.attention import select_kernels
from acespec.cloud.target.config import ModelArgs
from acespec.cloud.target.loader import DTYPES, load_model, set_threads
from acespec.cloud.target.model import Request, Transformer
from acespec.cloud.target.packed import select_linear
from acespec.cloud.target.tp_launch import local_group

log = logging.getLogger(__name__)

SHAPES = {  # random-weight models by name: (hidden, MLP, layers, heads, KV heads, vocab)
    "llama-8b": (4096, 14336, 32, 32, 8, 128256),
    "llama-1b": (2048, 8192, 16, 32, 8, 128256),
    "tiny": (256, 768, 4, 8, 2, 4096),
}


@dataclass
class Row:
    tp: int
    nodes: int
    pass_ms: float  # median
    pass_ms_p90: float
    allreduce_bytes: int  # per pass, rank 0's payload (0 on one device)


def random_model(shape: str, dtype: torch.dtype, device: str):
    d, f, layers, heads, kv, vocab = SHAPES[shape]
    args = ModelArgs(arch="llama", vocab_size=vocab, hidden_size=d, intermediate_size=f,
                     num_layers=layers, num_heads=heads, num_kv_heads=kv,
                     head_dim=d // heads, rope_theta=500000.0)
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02, generator=gen)
    return model.to(dtype).eval()


def profile(model, nodes: list[int], context: int, repeats: int, tp: int) -> list[Row]:
    """Median pass time per node count (after two warm-up passes each)."""
    vocab, rows = model.args.vocab_size, []
    gen = torch.Generator().manual_seed(0)
    cache = model.new_cache(context + max(nodes))
    model.forward_batch([Request(torch.randint(0, vocab, (context,), generator=gen).tolist(),
                                 cache, None, last_only=True)])
    for n in nodes:
        times, moved = [], []
        for i in range(repeats + 2):
            tokens = torch.randint(0, vocab, (n,), generator=gen).tolist()
            before = model.tp.reduce.bytes if model.tp else 0
            _sync(model)
            t0 = time.perf_counter()
            model.forward_batch([Request(tokens, cache)])[0].cpu()
            elapsed = time.perf_counter() - t0
            cache.truncate(context)
            if i >= 2:
                times.append(elapsed * 1000)
                moved.append((model.tp.reduce.bytes if model.tp else 0) - before)
        rows.append(Row(tp, n, round(statistics.median(times), 3),
                        round(float(np.percentile(times, 90)), 3), int(moved[-1])))
        log.info("tp=%d nodes=%d: %.2f ms", tp, n, rows[-1].pass_ms)
    return rows


def run(model_path: str, shape: str | None, tps: list[int], nodes: list[int], context: int,
        repeats: int, dtype: str, device: str, threads: int, linear: str = "auto"
        ) -> list[Row]:
    rows = []
    for tp in tps:
        if shape:
            ctx = contextlib.nullcontext(random_model(shape, DTYPES[dtype], device))
        elif tp == 1:
            ctx = contextlib.nullcontext(load_model(model_path, dtype=dtype, device=device))
        else:
            ctx = local_group(model_path, tp, dtype, device, threads, linear=linear)
        with ctx as model:
            if tp == 1:  # as `cloud serve` would run it: Triton on CUDA when installed
                set_threads(model, threads)
                model.kernels = select_kernels("auto", model.device)
                select_linear(linear, model)
            rows += profile(model, nodes, context, repeats, tp)
    return rows


def markdown(rows: list[Row]) -> str:
    tps = sorted({r.tp for r in rows})
    head = "| nodes | " + " | ".join(f"TP={t} ms (p90)" for t in tps)
    head += "".join(f" | TP={t} all-reduce / pass" for t in tps if t > 1)
    if len(tps) > 1:
        head += f" | TP={tps[-1]} / TP={tps[0]}"
    lines = [head + " |", "|" + "---|" * (head.count("|"))]
    for n in sorted({r.nodes for r in rows}):
        by = {r.tp: r for r in rows if r.nodes == n}
        cells = [f"{by[t].pass_ms:.2f} ({by[t].pass_ms_p90:.2f})" for t in tps]
        cells += [_size(by[t].allreduce_bytes) for t in tps if t > 1]
        if len(tps) > 1:
            cells.append(f"{by[tps[-1]].pass_ms / by[tps[0]].pass_ms:.2f}x")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def as_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
