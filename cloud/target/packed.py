"""Linear layers with their weights prepacked for oneDNN: a CPU pass whose cost is flat in rows.

On a CPU, `F.linear` goes to MKL's sgemm, which packs the weight matrix on every call when
the input has few rows, so a pass of 2-3 tokens (one draft beside the pass's own token)
costs far more than a lone pass of 1. oneDNN's linear with the weight reordered once, at
load time, into its blocked layout streams the weight once per call whatever the rows, so a
pass costs about the same for 1 to 8 tokens (figures in docs/benchmarks.md §5). This is
the prepacking torch's own Inductor does on the CPU (`torch.ops.mkldnn._reorder_linear_weight`
/ `_linear_pointwise`), applied to the verifier at load time. The result differs from `F.linear`'s in float32 rounding only
(reduction order), and both `ar` and the speculative modes run through it.

Inference only: a packed weight has no gradient; the training paths load their own model.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

DTYPES = (torch.float32, torch.bfloat16)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where oneDNN's prepacked linear runs: a CPU build with mkldnn, float32/bfloat16,
    whose result on a small probe equals F.linear's (checked once per dtype)."""
    return (device.type == "cpu" and dtype in DTYPES and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and _probe(dtype))


@functools.cache
def _probe(dtype: torch.dtype) -> bool:
    """oneDNN's packed linear on a 3 x 40 -> 24 probe is F.linear's within rounding: a
    build where it fails or differs (an untested platform) keeps torch's path."""
    g = torch.Generator().manual_seed(0)
    w, b, x = (torch.randn(*s, generator=g).to(dtype) for s in ((24, 40), (24,), (3, 40)))
    try:
        got = PackedLinear(w, b)(x).float()
    except RuntimeError as e:
        log.warning("oneDNN's prepacked linear fails here (%s): torch's F.linear runs", e)
        return False
    ref = F.linear(x.float(), w.float(), b.float())
    ok = bool((got - ref).abs().max() <= 0.05 * ref.abs().max())
    if not ok:
        log.warning("oneDNN's prepacked linear differs from F.linear here: torch's runs")
    return ok


class PackedLinear(nn.Module):
    """y = x W^T + b with W [out, in] held in oneDNN's blocked layout (opaque)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())  # opaque mkldnn
        self.bias = None if bias is None else bias.detach()  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out], in x's dtype."""
        lead = x.shape[:-1]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features).contiguous(),
                                               self.packed, self.bias, "none", [], "")
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN"


CHOICES = ("auto", "onednn", "torch")


def select_linear(choice: str, model: nn.Module) -> str:
    """Apply the verifier's `--linear` choice to a loaded model and return what runs:
    "onednn" (prepacked; `auto` picks it where available) or "torch" (`F.linear`)."""
    if choice not in CHOICES:
        raise ValueError(f"--linear {choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "torch":
        return "torch"
    packed = pack_linears(model)
    if packed == 0 and choice == "onednn":
        p = next(model.parameters())
        raise ValueError(f"--linear onednn: oneDNN's prepacked linear needs a CPU torch build "
                         f"with mkldnn whose packed linear works (see the log), and float32 or "
                         f"bfloat16 weights (here: {p.device.type}, "
                         f"{str(p.dtype).removeprefix('torch.')})")
    return "onednn" if packed else "torch"


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear of an inference model on the CPU by a PackedLinear; returns
    how many were packed (0 where oneDNN's packed linear is not available). A tied head
    keeps the embedding's weight for lookups and gets its own packed copy."""
    p = next(model.parameters(), None)
    if p is None or not available(p.device, p.dtype):
        return 0
    linears = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    for parent, name, child in linears:
        setattr(parent, name, PackedLinear(child.weight, child.bias))
    log.info("%d linear layers prepacked for oneDNN (%s)", len(linears), p.dtype)
    return len(linears)
