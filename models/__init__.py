"""The shipped model pairs and the code that builds and exports model files.

    demo/            the tiny demo pair (data), built by build_demo from demo_pair's recipe
                     (corpus, tokenizer_train, train, distill, card)
    smollm2/         SmolLM2-135M-Instruct: fetch and convert, the drafter's build (a package)
    gguf_export, gguf_to_hf, export_hf    model files both ways between torch, HF and GGUF
    sharegpt, pinned                      ShareGPT V3 and other files from pinned PyPI wheels
"""

from pathlib import Path

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])

DEMO_DIR = Path(__file__).resolve().parent / "demo"
DEMO_TARGET = DEMO_DIR / "target"
DEMO_DRAFTER = DEMO_DIR / "drafter-q8_0.gguf"
