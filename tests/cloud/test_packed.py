"""The verifier's oneDNN-prepacked linears (acespec.cloud.target.packed) against torch's F.linear and
against `transformers`, and `--linear` as a user passes it to `acespec cloud serve`.

Tolerance: float32 within 2e-4 absolute, as the target model's own tests (observed ~1e-5:
oneDNN sums in another order than MKL); bfloat16 within 2 % of the output's scale.
"""

from __future__ import annotations

import grpc
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from acespec.cloud.target import packed as packed_module  # noqa: E402
from acespec.cloud.target.loader import load_model  # noqa: E402
from acespec.cloud.target.packed import PackedLinear, available, pack_linears, select_linear  # noqa: E402
from acespec.proto import PROTOCOL_VERSION, acespec_pb2, acespec_pb2_grpc  # noqa: E402

from cli_harness import verifier  # noqa: E402

ATOL = 2e-4
CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(not available(CPU, torch.float32),
                                  reason="this torch build has no oneDNN prepacked linear")


@needs_onednn
@pytest.mark.parametrize("shape", [(37, 23), (1, 5), (300, 129)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(shape, bias):
    g = torch.Generator().manual_seed(sum(shape) + bias)
    w = torch.randn(*shape, generator=g)
    b = torch.randn(shape[0], generator=g) if bias else None
    packed = PackedLinear(w, b)
    for lead in [(1,), (2,), (3,), (7,), (2, 5)]:  # rows, and a batch of sequences
        x = torch.randn(*lead, shape[1], generator=g)
        y = packed(x)
        assert y.shape == (*lead, shape[0])
        assert (y - F.linear(x, w, b)).abs().max().item() < ATOL, lead


@pytest.mark.skipif(not available(CPU, torch.bfloat16),
                    reason="oneDNN's bfloat16 packed linear needs CPU instructions this machine "
                    "lacks (avx_ne_convert, or avx512bw/vl/dq); the verifier then runs F.linear")
def test_packed_bfloat16_close_to_f_linear():
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(64, 48, generator=g), torch.randn(5, 48, generator=g)
    y = PackedLinear(w.bfloat16(), None)(x.bfloat16())
    ref = F.linear(x, w)
    assert y.dtype == torch.bfloat16
    assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < 0.02


@needs_onednn
def test_packed_model_matches_transformers(hf_pair):
    """Prefill, then a tree in one pass: the packed target's logits are transformers'."""
    family, hf, path = hf_pair
    ours = load_model(path)
    n_linear = sum(isinstance(m, nn.Linear) for m in ours.modules())
    assert select_linear("auto", ours) == "onednn"
    assert not any(isinstance(m, nn.Linear) for m in ours.modules())
    assert sum(isinstance(m, PackedLinear) for m in ours.modules()) == n_linear
    seq = [5, 17, 3, 88, 42, 42, 7, 1, 60, 33]
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0].float()
    cache = ours.new_cache()
    diff = (ours(seq[:6], cache) - ref[:6]).abs().max().item()
    # the rest as a chain of 4 new nodes, each the child of the one before
    diff = max(diff, (ours(seq[6:], cache) - ref[6:]).abs().max().item())
    print(f"{family} packed max|diff| = {diff:.2e}")
    assert diff < ATOL


@needs_onednn
def test_head_packed_embedding_kept(hf_pair):
    """The head is packed; the embedding, tied to it or not, still serves lookups."""
    _, _, path = hf_pair
    ours = load_model(path)
    emb = ours.model.embed_tokens.weight.clone()
    pack_linears(ours)
    assert torch.equal(ours.model.embed_tokens.weight, emb)  # lookups read it unchanged
    assert isinstance(ours.lm_head, PackedLinear)


def test_linear_choice_torch_leaves_the_model_alone(hf_pair):
    _, _, path = hf_pair
    ours = load_model(path)
    before = [type(m) for m in ours.modules()]
    assert select_linear("torch", ours) == "torch"
    assert [type(m) for m in ours.modules()] == before


def test_linear_choice_errors_name_what_is_wrong(hf_pair):
    _, _, path = hf_pair
    with pytest.raises(ValueError, match="--linear 'fast': expected one of auto, onednn, torch"):
        select_linear("fast", load_model(path))
    half = load_model(path, dtype="float16")
    with pytest.raises(ValueError, match=r"--linear onednn: .*\(here: cpu, float16\)"):
        select_linear("onednn", half)
    assert select_linear("auto", half) == "torch"  # auto falls back where oneDNN cannot


@pytest.mark.slow
@needs_onednn
def test_cloud_serve_linear_flag_from_the_shell():
    """`acespec cloud serve --linear onednn|torch` says what runs, and serves `Generate`."""
    texts = {}
    for choice in ("onednn", "torch"):
        proc, addr = verifier("--linear", choice)
        with proc:
            assert f"linear layers: {choice}" in proc.stderr
            with grpc.insecure_channel(addr) as ch:
                stub = acespec_pb2_grpc.VerifierStub(ch)
                req = acespec_pb2.GenerateRequest(protocol_version=PROTOCOL_VERSION,
                                                  prompt_tokens=[1, 2, 3], max_tokens=12)
                texts[choice] = [t for m in stub.Generate(req, timeout=60) for t in m.tokens]
            assert proc.stop()[0] == 0
    assert len(texts["onednn"]) == 12
    assert texts["onednn"] == texts["torch"]  # greedy: the same tokens either way


def test_auto_keeps_torch_where_onednn_fails(hf_pair, monkeypatch, caplog):
    """A build whose packed linear raises (an untested platform) runs F.linear under auto,
    and `--linear onednn` says why it cannot."""
    def broken(self, x):
        raise RuntimeError("no oneDNN kernel for this CPU")

    _, _, path = hf_pair
    monkeypatch.setattr(packed_module.PackedLinear, "forward", broken)
    packed_module._probe.cache_clear()
    try:
        model = load_model(path)
        assert select_linear("auto", model) == "torch"
        assert not any(isinstance(m, PackedLinear) for m in model.modules())
        assert "no oneDNN kernel for this CPU" in caplog.text
        with pytest.raises(ValueError, match="--linear onednn: oneDNN's prepacked linear"):
            select_linear("onednn", model)
    finally:
        monkeypatch.undo()
        packed_module._probe.cache_clear()
