"""`acespec edge service install|uninstall|status`: `edge serve --config FILE` started at login
by the user's service manager, a systemd user unit on Linux or a launchd agent on macOS; it
restarts the server when it fails. The files go where each manager looks for the user's own:
$XDG_CONFIG_HOME/systemd/user (else ~/.config/systemd/user) and ~/Library/LaunchAgents."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

from acespec import environ
from acespec.argtypes import EXIT_USAGE
from acespec.edge import config

UNIT = "acespec-edge.service"
LABEL = "org.acespec.edge"
EXIT_NOT_INSTALLED = 3  # as `systemctl status` says of a unit that is not running


def program() -> list[str]:
    """The command that starts acespec: this environment's console script, else its Python."""
    script = Path(sys.executable).with_name("acespec")
    return [str(script)] if script.is_file() else [sys.executable, "-P", "-m", "acespec"]


def serve_command(settings: Path) -> list[str]:
    return [*program(), "edge", "serve", "--config", str(settings)]


def unit_path() -> Path:
    return environ.config_dir() / "systemd" / "user" / UNIT


def plist_path() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"


def _systemd_quote(arg: str) -> str:
    """One ExecStart word: specifiers (%) and variables ($) escaped, quoted when needed."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c in arg for c in ' \t"\'\\;'):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_text(command: list[str]) -> str:
    return (
        "[Unit]\n"
        "Description=AceSpec edge: local OpenAI-compatible server, verified by the cloud\n"
        "\n"
        "[Service]\n"
        f"ExecStart={' '.join(map(_systemd_quote, command))}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "TimeoutStopSec=15\n\n"  # serve ends its streams and exits within 5 s of SIGTERM
        "[Install]\n"
        "WantedBy=default.target\n")


def plist_bytes(command: list[str]) -> bytes:
    logs = Path.home() / "Library" / "Logs" / "acespec-edge.log"
    return plistlib.dumps({
        "Label": LABEL, "ProgramArguments": command, "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restart it when it fails
        "ThrottleInterval": 5, "ProcessType": "Background",
        "StandardOutPath": str(logs), "StandardErrorPath": str(logs)})


def _manager_commands(manager: str, action: str) -> list[list[str]]:
    """What the service manager is asked to do after install or before uninstall."""
    if manager == "systemd":
        return {"install": [["systemctl", "--user", "daemon-reload"],
                            ["systemctl", "--user", "enable", UNIT],
                            ["systemctl", "--user", "restart", UNIT]],
                "uninstall": [["systemctl", "--user", "disable", "--now", UNIT]],
                "removed": [["systemctl", "--user", "daemon-reload"]]}[action]
    domain = f"gui/{os.getuid()}"
    return {"install": [["launchctl", "bootout", f"{domain}/{LABEL}"],
                        ["launchctl", "bootstrap", domain, str(plist_path())]],
            "uninstall": [["launchctl", "bootout", f"{domain}/{LABEL}"]],
            "removed": []}[action]


def _ask(commands: list[list[str]], tolerate_first: bool = False) -> str | None:
    """Run the manager's commands; None when all succeed, else why not (one line)."""
    for i, cmd in enumerate(commands):
        if shutil.which(cmd[0]) is None:
            return f"{cmd[0]} not found"
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode != 0 and not (tolerate_first and i == 0):
            why = (r.stderr.strip() or r.stdout.strip()).splitlines()
            return f"`{' '.join(cmd)}` failed: {why[0] if why else f'exit {r.returncode}'}"
    return None


def _running(manager: str) -> str:
    cmd = (["systemctl", "--user", "is-active", UNIT] if manager == "systemd" else
           ["launchctl", "print", f"gui/{os.getuid()}/{LABEL}"])
    if shutil.which(cmd[0]) is None:
        return f"unknown ({cmd[0]} not found)"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if manager == "systemd":  # active, inactive, failed, ...
        err = r.stderr.strip().splitlines()
        return r.stdout.strip() or (f"unknown ({err[0]})" if err else "unknown")
    return "loaded" if r.returncode == 0 else "not loaded"


def run(args) -> int:
    manager = args.manager or ("launchd" if sys.platform == "darwin" else "systemd")
    path = unit_path() if manager == "systemd" else plist_path()
    what = f"systemd user unit {UNIT}" if manager == "systemd" else f"launchd agent {LABEL}"
    if args.action == "status":
        if not path.is_file():
            print(f"not installed: no {what} at {path}")
            return EXIT_NOT_INSTALLED
        print(f"installed: {what} at {path}\nrunning: {_running(manager)}")
        return 0
    if args.action == "uninstall":
        if not path.is_file():
            print(f"not installed: no {what} at {path}; nothing to remove")
            return 0
        why = _ask(_manager_commands(manager, "uninstall"))
        path.unlink()
        _ask(_manager_commands(manager, "removed"))
        print(f"removed {path}" + (f" (the manager was not told: {why})" if why else ""))
        return 0
    return _install(args, manager, path, what)


def _install(args, manager: str, path: Path, what: str) -> int:
    settings = Path(args._settings_file or config.default_path()).resolve()
    if not settings.is_file():
        print(f"acespec edge service: error: no settings file {settings}: write one first "
              "(`cloud = \"HOST:PORT\"`, `pair = \"smollm2\"`, ...; `acespec edge config` "
              "shows what edge serve would run with)", file=sys.stderr)
        return EXIT_USAGE
    args._serve_parser.parse_args(["--config", str(settings)])  # a bad file ends here
    command = serve_command(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    if manager == "systemd":
        path.write_text(unit_text(command))
    else:
        path.write_bytes(plist_bytes(command))
    print(f"wrote {what}: {path}\n  runs: {' '.join(command)}")
    why = _ask(_manager_commands(manager, "install"), tolerate_first=manager == "launchd")
    if why:
        todo = "; ".join(" ".join(c) for c in _manager_commands(manager, "install"))
        print(f"not started: {why}; start it with: {todo}")
    else:
        print("enabled and started: it runs at login (`acespec edge service status`)")
    return 0
