"""Triton kernels for the verifier, each beside its torch reference (see DESIGN §9)."""
