"""`python -m acespec.cloud serve ...`: the verifier's commands, as torchrun launches them
(`torchrun --nproc-per-node N -m acespec.cloud serve --model DIR`)."""

import sys

from acespec.cli import main

sys.exit(main(["cloud", *sys.argv[1:]]))
