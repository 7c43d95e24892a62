"""The verifier with its Triton path (interpreted on the CPU) against its torch reference
path: the same model, the same requests, over the paged KV cache."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from acespec.cloud.target.attention import select_kernels  # noqa: E402
from acespec.cloud.target.model import Request  # noqa: E402
from acespec.cloud.verify.engine import Engine  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402

from verifier_harness import run  # noqa: E402


def twins(model):
    """(reference, triton) copies of one model: identical weights, separate page pools."""
    ref, tri = copy.deepcopy(model), copy.deepcopy(model)
    ref.kernels, tri.kernels = "torch", "triton"
    return ref, tri


@pytest.mark.slow
def test_batched_tree_passes_match_the_reference(tiny_pair):
    """Three sessions in each forward pass: prefill, then trees branching off earlier
    passes' nodes, a commit (retain + compaction) in between. Logits of every pass agree
    within 1e-4 (fp32)."""
    _, model, _ = tiny_pair
    rng = np.random.default_rng(0)
    outs = {}
    for name, m in zip(("torch", "triton"), twins(model)):
        r = np.random.default_rng(0)
        caches = [m.new_cache(capacity=8) for _ in range(3)]
        logs = [m.forward_batch([Request(r.integers(0, 300, n).tolist(), c, None)
                                 for c, n in zip(caches, (5, 17, 33))])]
        for step in range(3):
            reqs = []
            for c in caches:
                n = int(r.integers(1, 12))
                parents = [int(r.integers(max(0, c.length - 20), c.length + i)) for i in range(n)]
                reqs.append(Request(r.integers(0, 300, n).tolist(), c, parents))
            logs.append(m.forward_batch(reqs))
            if step == 1:
                for c in caches:  # commit: keep the chain and the path to the last slot
                    c.retain(sorted(set(range(c.n_linear)) | set(c.path_to(c.length - 1))))
        outs[name] = logs
    del rng
    worst = max((a - b).abs().max().item() for pa, pb in zip(outs["torch"], outs["triton"])
                for a, b in zip(pa, pb))
    assert worst < 1e-4, worst


@pytest.mark.slow
def test_verifier_scores_equal_with_the_triton_path(tiny_pair):
    """Engine sessions (open, chains and branches, sampled p~ with tails): every NodeScore
    of the Triton path (tree attention + fused encoder) equals the reference path's."""
    tok_dir, model, _ = tiny_pair
    params = ServeParams(SamplingParams(temperature=0.9, top_k=24, top_p=0.95), send_mass=0.6,
                         tail_samples=2)

    async def scores(m):
        engine = Engine(m, "v", "tiny")
        res = await engine.open(list(range(3, 40)), params, seed=9)
        out = [res.root]
        s = res.session
        nid = 1
        for tokens, parents in (([5, 6, 7], [0, 1, 2]), ([8, 9], [1, 0]), ([10, 11, 12], [3, 5, 6])):
            (batch,) = await engine.extend_many(s, [(nid, np.array(tokens), np.array(parents))])
            out += batch
            nid += len(tokens)
        await engine.close_all()
        return out

    ref, tri = twins(model)
    a, b = run(scores(ref)), run(scores(tri))
    assert len(a) == len(b) == 9
    for x, y in zip(a, b):
        assert (x.node_id, x.self_units, x.tail_units) == (y.node_id, y.self_units, y.tail_units)
        for f in ("ids", "units", "tail_ids", "tail_sample_units"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), (x.node_id, f)


def test_kernel_choice_is_logged_and_checked(caplog):
    caplog.set_level("INFO")
    assert select_kernels("auto", "cpu") == "torch"
    assert select_kernels("triton", "cpu") == "triton"
    assert "verifier kernels: torch reference (device cpu)" in caplog.text
    with pytest.raises(ValueError, match="kernels must be one of"):
        select_kernels("cuda-magic", "cpu")
