"""The edge's settings file, edge.toml: the flags of `edge serve`, `generate` and `doctor`
written down once. A key is a flag's long name (`cloud`, `auth-token-file`; `_` may stand for
`-`) and its value what the flag takes: a string or number, true/false for a switch, a list for
a repeatable flag. A relative path is relative to the file's folder. Flags on the command line
override the file, and the file overrides the flags' defaults.

    cloud = "gpu-host:50051"
    pair = "smollm2"
    auth-token-file = "verifier.token"
    offline = "local"

SettingsParser, the parser class of those commands, reads the file while it parses: --config
PATH, else acespec/edge.toml in the user's settings folder ($XDG_CONFIG_HOME or ~/.config)
when there is one. A flag's declaration is the only one: the file feeds its value to argparse
as the namespace's starting value, checked by the flag's own type and choices."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package (the edge extra's)
    import tomli as tomllib

from acespec import environ
from acespec.argtypes import EXIT_USAGE, OneLineErrors

FILE = Path("acespec") / "edge.toml"
SECRETS = frozenset({"api_key"})  # dests shown redacted
# dests whose value is a file: `~` expands, and a relative path is the settings file's folder's
PATHS = frozenset({"drafter", "tokenizer", "tls_ca", "auth_token_file", "api_key_file",
                   "chat_template"})
NOT_SETTINGS = frozenset({"help", "config"})
# One choice each: a flag for one drops the file's other, and a file may not set both.
CHOICES = (("pair", "drafter"), ("api_key", "api_key_file"))


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and the key."""


def default_path() -> Path:
    return environ.config_dir() / FILE


def settings_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """key -> action: the parser's flags that a settings file may set."""
    return {max(a.option_strings, key=len).lstrip("-"): a for a in parser._actions
            if a.option_strings and a.dest not in NOT_SETTINGS
            and not isinstance(a, argparse._HelpAction | argparse._VersionAction)}


class SettingsParser(OneLineErrors):
    """A command parser whose defaults come from the settings file. `family`: the parsers
    that share the file (a key one of them takes is not unknown to the others). The parsed
    namespace also holds `_settings_file` (the file read, or None) and `_sources` (key ->
    (dest, 'flag' | 'file' | 'default'))."""

    family: tuple[argparse.ArgumentParser, ...] = ()

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        if not any(a.dest == "config" for a in self._actions):
            return super().parse_known_args(args, namespace)
        keys = settings_of(self)
        # Which flags were given: parse once over a namespace where every value is None,
        # so argparse fills in no default (--help and bad flags end here, before the file).
        probe, _ = super().parse_known_args(
            args, argparse.Namespace(**{a.dest: None for a in self._actions}))
        given = {a.dest for a in keys.values() if getattr(probe, a.dest) is not None}
        path = Path(probe.config).expanduser() if probe.config else default_path()
        try:
            read = probe.config is not None or path.is_file()
            values = self._read(path) if read else {}
        except SettingsError as e:
            self.exit(EXIT_USAGE, f"{self.prog}: error: {e}\n")
        for choice in CHOICES:
            if given & set(choice):
                values = {d: v for d, v in values.items() if d not in choice}
        start = {**vars(namespace or argparse.Namespace()),
                 **{d: v for d, v in values.items() if d not in given}}
        parsed, extras = super().parse_known_args(args, argparse.Namespace(**start))
        parsed._settings_file = str(path) if read else None
        parsed._sources = {key: (a.dest, "flag" if a.dest in given else
                                 "file" if a.dest in values else "default")
                           for key, a in keys.items()}
        return parsed, extras

    def _read(self, path: Path) -> dict[str, object]:
        """dest -> value of the file's settings this command takes, each checked by its
        flag's type and choices; SettingsError naming the file and the key."""
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise SettingsError(f"{path}: cannot read it: {e.strerror or e}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise SettingsError(f"{path}: not a TOML file: {e}") from None
        own = settings_of(self)
        known = {k: a for p in (*self.family, self) for k, a in settings_of(p).items()}
        values: dict[str, object] = {}
        for name, raw in data.items():
            key = name.replace("_", "-")
            if isinstance(raw, dict):
                raise SettingsError(f"{path}: [{name}]: settings are top-level `key = value` "
                                    "lines, not tables")
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                raise SettingsError(
                    f"{path}: unknown key {name!r}"
                    + (f" (did you mean {near[0]!r}?)" if near else "")
                    + f"; the keys are the flags of acespec edge serve/generate/doctor: "
                    f"{', '.join(sorted(known))}")
            value = _value(path, key, known[key], raw)  # another command's: checked too
            if key in own:
                values[own[key].dest] = value
        for choice in CHOICES:
            if all(d in values for d in choice):
                raise SettingsError(f"{path}: {' and '.join(d.replace('_', '-') for d in choice)}"
                                    ": set one of them")
        return values


def _value(path: Path, key: str, action: argparse.Action, raw: object) -> object:
    """The value `raw` (as TOML read it) gives the flag `action`, as argparse would hold it."""
    def bad(wants: str) -> SettingsError:
        return SettingsError(f"{path}: {key}: must be {wants}, got {_toml(raw)}")

    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(raw, bool):
            raise bad("true or false")
        return raw == isinstance(action, argparse._StoreTrueAction)
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*")
    if isinstance(raw, list) != many and not (many and isinstance(raw, str)):
        raise bad("a list of values" if many else "one value, not a list")
    items = raw if isinstance(raw, list) else [raw]
    if many and not items and action.nargs == "+":
        raise bad("a list of one value or more")
    out = [_one(path, key, action, x, bad) for x in items]
    return out if many else out[0]


def _one(path: Path, key: str, action: argparse.Action, raw: object, bad) -> object:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise bad("a string" if action.type is None else "a number or a string")
    if action.type is None:
        if not isinstance(raw, str):
            raise bad("a string")
        value: object = raw
    else:
        try:
            value = action.type(str(raw))
        except argparse.ArgumentTypeError as e:
            raise SettingsError(f"{path}: {key}: {e}") from None
        except (TypeError, ValueError):
            raise bad(f"a value {getattr(action.type, '__name__', 'its type')} reads") from None
    if action.choices is not None and value not in action.choices:
        raise bad(f"one of {', '.join(map(str, action.choices))}")
    if action.dest in PATHS and isinstance(value, str) and value != "ngram":
        value = str(path.parent / Path(value).expanduser())
    return value


def _toml(value: object) -> str:
    """`value` as a TOML value (a tuple of numbers as the 'A,B' string its flag takes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(",".join(f"{x:g}" for x in value))
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


def run_show(args: argparse.Namespace) -> int:
    """`acespec edge config`: every setting of `edge serve` as it would run, where it came
    from, in the file's own syntax (secrets redacted)."""
    file = args._settings_file
    print(f"# acespec edge serve's settings; file: "
          f"{file or f'none ({default_path()} does not exist)'}")
    rows = []
    for key, (dest, source) in args._sources.items():
        value = getattr(args, dest)
        if value is None:
            text = f"# {key} (unset)"
        else:
            text = f"{key} = " + ('"<redacted>"' if dest in SECRETS else _toml(value))
        rows.append((text, source))
    width = max(len(t) for t, _ in rows)
    for text, source in rows:
        print(f"{text:<{width}}  # {source}")
    return 0


def blame(args: argparse.Namespace, message: str) -> str:
    """An error that starts with the flag it is about ('--drafter X: no such file'), with
    the settings file named when that flag's value came from it."""
    flag = message.split(" ", 1)[0].rstrip(":")
    sources = getattr(args, "_sources", {})
    if flag.startswith("--") and sources.get(flag[2:], ("", ""))[1] == "file":
        return f"{message} (key {flag[2:]} in {args._settings_file})"
    return message
