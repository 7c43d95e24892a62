"""Build-time check that an image holds its own side only: the cloud image no llama.cpp,
the edge image no torch. `python sides.py cloud|edge` exits non-zero otherwise."""

import importlib.util
import sys

NEEDS = {"cloud": ("torch", "grpc", "acespec.cloud"), "edge": ("llama_cpp", "grpc", "acespec.edge")}
FORBIDS = {"cloud": "llama_cpp", "edge": "torch"}

side = sys.argv[1]
missing = [m for m in NEEDS[side] if importlib.util.find_spec(m) is None]
if missing or importlib.util.find_spec(FORBIDS[side]) is not None:
    sys.exit(f"{side} image: missing {missing} or holds {FORBIDS[side]}")
print(f"{side} image: has {', '.join(NEEDS[side])}; no {FORBIDS[side]}")
