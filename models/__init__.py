"""The shipped demo model pair and the code that builds and exports model files."""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent / "demo"
DEMO_TARGET = DEMO_DIR / "target"
DEMO_DRAFTER = DEMO_DIR / "drafter-q8_0.gguf"
