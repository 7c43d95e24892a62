"""`acespec edge service install|uninstall|status` from the shell, into a temporary home: the
systemd user unit passes `systemd-analyze verify`, the launchd agent parses with plistlib, each
runs `edge serve --config FILE` with this environment's acespec, and the service manager is
asked to enable and start it (a stand-in `systemctl`/`launchctl` on PATH records what it was
asked, so no real manager is touched)."""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_harness import ACESPEC, acespec

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
[ "$2" = is-active ] && echo active
exit 0
"""


@pytest.fixture
def user(tmp_path: Path) -> dict:
    """A user with a fresh home, a settings file, and recording systemctl and launchctl."""
    home, xdg, bin_dir = tmp_path / "home", tmp_path / "xdg", tmp_path / "bin"
    for d in (home, xdg / "acespec", bin_dir):
        d.mkdir(parents=True)
    settings = xdg / "acespec" / "edge.toml"
    settings.write_text('cloud = "gpu-host:50051"\nport = 8011\n')
    log = tmp_path / "manager.log"
    for name in ("systemctl", "launchctl"):
        (bin_dir / name).write_text(RECORDER.format(log=log))
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(xdg),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return {"env": env, "home": home, "xdg": xdg, "settings": settings, "log": log}


def asked(user) -> list[str]:
    return user["log"].read_text().splitlines() if user["log"].exists() else []


def run(user, *args: str) -> subprocess.CompletedProcess:
    return acespec("edge", "service", *args, env=user["env"], timeout=60)


def test_systemd_unit_installs_verifies_and_uninstalls(user, tmp_path):
    r = run(user, "status")
    assert r.returncode == 3 and r.stdout.startswith("not installed"), r.stdout + r.stderr
    r = run(user, "install", "--manager", "systemd")
    assert r.returncode == 0, r.stderr
    unit = user["xdg"] / "systemd" / "user" / "acespec-edge.service"
    assert f"wrote systemd user unit acespec-edge.service: {unit}" in r.stdout
    assert "enabled and started" in r.stdout
    assert asked(user) == ["systemctl --user daemon-reload",
                           "systemctl --user enable acespec-edge.service",
                           "systemctl --user restart acespec-edge.service"]
    lines = unit.read_text().splitlines()
    exec_start = next(ln for ln in lines if ln.startswith("ExecStart="))
    command = shlex.split(exec_start.removeprefix("ExecStart="))
    assert command == [ACESPEC, "edge", "serve", "--config", str(user["settings"])]
    assert "Restart=on-failure" in lines and "WantedBy=default.target" in lines
    # the command the unit runs reads that file (edge config: serve's settings, not a server)
    shown = subprocess.run([*command[:2], "config", *command[3:]], env=user["env"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and 'cloud = "gpu-host:50051"  ' in shown.stdout, shown.stderr

    r = run(user, "status")
    assert r.returncode == 0 and r.stdout == (f"installed: systemd user unit "
                                              f"acespec-edge.service at {unit}\nrunning: active\n")
    r = run(user, "uninstall")
    assert r.returncode == 0 and not unit.exists(), r.stdout + r.stderr
    assert asked(user)[-2:] == ["systemctl --user disable --now acespec-edge.service",
                                "systemctl --user daemon-reload"]
    assert run(user, "status").returncode == 3


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (scripts/install.sh installs it)")
def test_the_unit_passes_systemd_analyze_verify(user, tmp_path):
    """... with a settings file whose path needs quoting and escaping in a unit."""
    odd = tmp_path / "my 100% settings" / "edge.toml"
    odd.parent.mkdir()
    odd.write_text('cloud = "gpu-host:50051"\n')
    assert run(user, "install", "--manager", "systemd", "--config", str(odd)).returncode == 0
    unit = user["xdg"] / "systemd" / "user" / "acespec-edge.service"
    assert f'--config "{tmp_path}/my 100%% settings/edge.toml"\n' in unit.read_text()
    runtime = tmp_path / "runtime"  # the user manager's runtime folder: a container has none
    runtime.mkdir(mode=0o700)
    r = subprocess.run(["systemd-analyze", "verify", "--user", str(unit)],
                       env={**user["env"], "XDG_RUNTIME_DIR": str(runtime)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stdout + r.stderr


def test_launchd_agent_is_a_plist_naming_the_program_and_arguments(user):
    r = run(user, "install", "--manager", "launchd")
    assert r.returncode == 0, r.stderr
    path = user["home"] / "Library" / "LaunchAgents" / "org.acespec.edge.plist"
    with path.open("rb") as f:
        agent = plistlib.load(f)
    assert agent["Label"] == "org.acespec.edge"
    assert agent["ProgramArguments"] == [ACESPEC, "edge", "serve", "--config",
                                         str(user["settings"])]
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    uid = os.getuid()
    assert asked(user) == [f"launchctl bootout gui/{uid}/org.acespec.edge",
                           f"launchctl bootstrap gui/{uid} {path}"]
    r = run(user, "status", "--manager", "launchd")
    assert r.returncode == 0 and r.stdout.startswith(f"installed: launchd agent "
                                                     f"org.acespec.edge at {path}")
    assert run(user, "uninstall", "--manager", "launchd").returncode == 0 and not path.exists()


def test_install_wants_a_usable_settings_file(user, tmp_path):
    user["settings"].unlink()
    r = run(user, "install", "--manager", "systemd")
    assert r.returncode == 2 and f"no settings file {user['settings']}: write one" in r.stderr
    user["settings"].write_text("port = 0\n")
    r = run(user, "install", "--manager", "systemd")
    assert r.returncode == 2
    assert f"{user['settings']}: port: must be an integer in [1, 65535], got '0'" in r.stderr
    named = tmp_path / "laptop.toml"
    named.write_text('cloud = "other:1"\n')
    r = run(user, "install", "--manager", "systemd", "--config", str(named))
    assert r.returncode == 0, r.stderr
    unit = (user["xdg"] / "systemd" / "user" / "acespec-edge.service").read_text()
    assert f"--config {named}\n" in unit
