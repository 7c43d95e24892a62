"""argparse pieces shared by the commands: numbers in a range, a parser whose errors are
one line (exit 2) naming the flag, not the whole usage block, and commands whose modules are
imported only when they run."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable
from types import ModuleType

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


def ms_profile(text: str, shape: str, most: int, flag: str = "",
               whole_third: bool = False) -> tuple[float, ...]:
    """A TESTBED step profile such as 'T0,PER_NODE,KNEE': 1 to `most` comma-separated finite
    numbers >= 0 (milliseconds; with whole_third, the third a whole number), then zeros up to
    `most`. ValueError "[FLAG ]wants SHAPE, got TEXT" if it is not one."""
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= most or any(not (math.isfinite(x) and x >= 0) for x in parts) \
            or (whole_third and len(parts) == 3 and parts[2] != int(parts[2])):
        raise ValueError(f"{flag + ' ' if flag else ''}wants {shape}, got {text!r}")
    return (*parts, *[0.0] * (most - len(parts)))


def draft_ms(text: str) -> tuple[float, float]:
    """--emulate-draft-ms T[,PER_TOKEN]: two non-negative milliseconds."""
    try:
        return ms_profile(text, "T[,PER_TOKEN] in ms, >= 0", 2)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def command_group(sub, name: str, help: str):
    """`acespec NAME COMMAND ...`: add NAME to `sub`; returns the subparsers of its commands."""
    p = sub.add_parser(name, help=help)
    return p.add_subparsers(dest=f"{name}_cmd", required=True, metavar="COMMAND")


def command(load: Callable[[], ModuleType], name: str) -> Callable[[argparse.Namespace], int]:
    """A parser's `func`: the function `name` of the module load() imports when the command
    runs, so that building the parsers (every `acespec` call does) imports no command."""
    def run(args: argparse.Namespace) -> int:
        return getattr(load(), name)(args)
    return run


def dispatch(args: argparse.Namespace, level: int) -> int:
    """Run a parsed command (its `func`) with logging at `level`; Ctrl-C is exit 130."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

