"""AceSpec: edge-cloud speculative decoding over slow links.

Subpackages: acespec.shared (pure math both sides use), acespec.edge (drafter, engine),
acespec.cloud (target model, verifier), acespec.proto, acespec.kernels, acespec.sim,
acespec.models (demo pair and exporters).
"""

__version__ = "0.1.0"
