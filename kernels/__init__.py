"""Triton kernels for the verifier, each beside its torch reference (see docs/design.md §9)."""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])
