"""`python -m acespec.cloud serve ...`: the verifier's commands, as torchrun launches them
(`torchrun --nproc-per-node N -m acespec.cloud serve --model DIR`). Same flags as
`acespec cloud ...`; imports nothing of the edge."""

from __future__ import annotations

import logging
import sys

from acespec.argtypes import OneLineErrors, dispatch
from acespec.cloud.cli import add_parser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrors(prog="acespec")
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["cloud", *(sys.argv[1:] if argv is None else argv)])
    return dispatch(args, logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
