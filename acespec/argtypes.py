"""argparse pieces shared by the commands: numbers in a range, and a parser whose errors are
one line (exit 2) naming the flag, not the whole usage block."""

from __future__ import annotations

import argparse
import math
import sys

EXIT_USAGE = 2


class OneLineErrors(argparse.ArgumentParser):
    """A bad flag is reported in one line naming it (not the whole usage block). Subparsers
    made from one inherit the class.

    A parser with sub-commands may name one its `default_command`: arguments that start with
    no sub-command's name (nor --help) are that command's, so `acespec bench --depth 8` is
    `acespec bench run --depth 8`."""

    default_command: str | None = None

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        if self.default_command is not None:
            args = list(sys.argv[1:] if args is None else args)
            names = {name for action in self._actions
                     if isinstance(action, argparse._SubParsersAction) for name in action.choices}
            if not args or args[0] not in names | {"-h", "--help"}:
                args.insert(0, self.default_command)
        return super().parse_known_args(args, namespace)


def number(kind, lo=None, hi=None, lo_open=False):
    """An argparse type: a `kind` (int or float) in [lo, hi] ((lo, hi] with lo_open), finite."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        bad = value is None or (kind is float and not math.isfinite(value)) or \
            (lo is not None and (value <= lo if lo_open else value < lo)) or \
            (hi is not None and value > hi)
        if bad:
            noun = "an integer" if kind is int else "a number"
            span = f"{'(' if lo_open else '['}{lo}, {'inf)' if hi is None else f'{hi}]'}"
            raise argparse.ArgumentTypeError(f"must be {noun} in {span}, got {text!r}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


def draft_ms(text: str) -> tuple[float, float]:
    """--emulate-draft-ms T[,PER_TOKEN]: two non-negative milliseconds."""
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 2 or any(not math.isfinite(x) or x < 0 for x in parts):
        raise argparse.ArgumentTypeError(f"wants T[,PER_TOKEN] in ms, >= 0, got {text!r}")
    return parts[0], parts[1] if len(parts) > 1 else 0.0


def dispatch(args: argparse.Namespace, level: int) -> int:
    """Run a parsed command (its `func`) with logging at `level`; Ctrl-C is exit 130."""
    import logging

    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

