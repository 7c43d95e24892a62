"""One-shot GPU check of the verifier kernels: correctness on the device, then benchmarks at
realistic shapes, printed as a table (and written as JSON with --out).

    python -m acespec.kernels.gpucheck [--out results.json] [--quick]

Shapes: an 8B-class target (32 query heads, 8 KV heads, head dim 128, bf16), contexts 1k-32k,
1-64 sessions, trees of 8-64 nodes, and the served encoder at a 151,936-token vocabulary.
Designed to finish in under 5 minutes on an H100/H200. Without CUDA it says so and, with
--cpu-smoke, runs tiny shapes through the Triton interpreter to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial

import numpy as np

from acespec.procs import SAFE_PATH_VAR, python_module
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams


def _time_ms(fn, reps: int = 20) -> float:
    # lazy: torch and Triton, after main has set TRITON_INTERPRET (--cpu-smoke)
    import torch
    import triton

    if torch.cuda.is_available():
        return float(triton.testing.do_bench(fn, warmup=5, rep=reps * 5))
    t = time.perf_counter()
    for _ in range(3):
        fn()
    return (time.perf_counter() - t) / 3 * 1000


def check_attention(device: str, shapes, tol: float = 3e-2) -> list[dict]:
    """Triton vs the torch reference on each shape: max |diff| (bf16), plus timings of the
    Triton kernel, SDPA with an explicit mask and the reference."""
    import torch  # lazy: as _time_ms's

    # lazy: --cpu-smoke sets TRITON_INTERPRET in main, before the kernels are jitted
    from acespec.kernels.tree_attention import (
        random_batch,
        sdpa_with_mask,
        tree_attention,
        tree_attention_ref,
    )

    rows = []
    for sessions, ctx, tree in shapes:
        a = random_batch(sessions, ctx, tree, 32, 8, 128, 16, torch.bfloat16, device)
        err = (tree_attention(**a).float() - tree_attention_ref(**a).float()).abs().max().item()
        row = {"kernel": "tree_attention", "sessions": sessions, "ctx": ctx, "tree": tree,
               "max_abs_err": round(err, 5), "ok": err <= tol,
               "triton_ms": round(_time_ms(partial(tree_attention, **a)), 3),
               "sdpa_mask_ms": round(_time_ms(partial(sdpa_with_mask, a)), 3)}
        if sessions * ctx <= 64 * 1024:  # the per-session reference is slow on big batches
            row["reference_ms"] = round(_time_ms(partial(tree_attention_ref, **a), reps=3), 3)
        rows.append(row)
        _print_row(row)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def check_encoder(device: str, vocab: int, node_counts) -> list[dict]:
    """Fused encoder vs the numpy reference: outputs equal, and timings."""
    import torch  # lazy: as _time_ms's

    from acespec.kernels.served_encoder import encode, encode_ref  # lazy: as check_attention's

    p = ServeParams(SamplingParams(temperature=0.8, top_k=50, top_p=0.95), k_max=64,
                    send_mass=0.9, tail_samples=2)
    rows = []
    for n in node_counts:
        g = torch.Generator(device="cpu").manual_seed(n)
        logits = (torch.randn(n, vocab, generator=g) * 3).to(device)
        args = (logits, p, 0, list(range(n)), [0] * n, [-1] + list(range(n - 1)))
        got, ref = encode(*args), encode_ref(*args)
        same = all(np.array_equal(getattr(got, f), getattr(ref, f)) for f in
                   ("ids", "units", "n_sent", "tail_units", "tail_ids", "self_units"))
        row = {"kernel": "served_encoder", "nodes": n, "vocab": vocab, "ok": same,
               "triton_ms": round(_time_ms(partial(encode, *args)), 3),
               "reference_ms": round(_time_ms(partial(encode_ref, *args), reps=3), 3)}
        rows.append(row)
        _print_row(row)
    return rows


def _print_row(row: dict) -> None:
    print(" | ".join(f"{k}={v}" for k, v in row.items()), flush=True)


def markdown(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def run_tests() -> int:
    """The kernel test files, natively on the GPU (no interpreter)."""
    # The tests run from the repository root: keep it off sys.path (docs/design.md §2).
    env = dict(os.environ, ACESPEC_TRITON_GPU="1", **{SAFE_PATH_VAR: "1"})
    env.pop("TRITON_INTERPRET", None)
    tests = [t for t in ("tests/kernels/test_kernels.py", "tests/kernels/test_kernels_verifier.py")
             if os.path.isfile(t)]
    if not tests:
        print("kernel tests not found (run from the repository root); skipping them")
        return 0
    return subprocess.call([*python_module("pytest"), "-q", *tests], env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m acespec.kernels.gpucheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (about a minute)")
    ap.add_argument("--no-tests", action="store_true", help="skip the pytest run")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: tiny shapes in the Triton interpreter (checks the script)")
    args = ap.parse_args(argv)
    import torch  # lazy: as _time_ms's

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("gpucheck: no CUDA device here; nothing to measure (use --cpu-smoke to check "
              "the script in the Triton interpreter)", file=sys.stderr)
        return 2
    t0 = time.time()
    rc = 0
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
        if not args.no_tests:
            rc = run_tests()
        shapes = [(1, 1024, 8), (8, 1024, 32), (64, 1024, 8), (8, 4096, 32), (1, 16384, 64),
                  (8, 16384, 32), (1, 32768, 64), (8, 32768, 8)]
        if args.quick:
            shapes = shapes[:3]
        rows = check_attention("cuda", shapes)
        rows += check_encoder("cuda", 151_936, [8, 64] if args.quick else [8, 32, 64, 256])
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        rows = check_attention("cpu", [(2, 40, 8)])
        rows += check_encoder("cpu", 2048, [4])
    print()
    print(markdown(rows))
    print(f"\ngpucheck: {len(rows)} rows in {time.time() - t0:.0f} s; "
          f"{sum(not r['ok'] for r in rows)} failed correctness checks; tests rc={rc}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if rc == 0 and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
