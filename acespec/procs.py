"""Child processes of AceSpec's own commands: how they are started, waiting for their ports
and for them to leave.

Libraries (`acespec.sim`, `acespec.cloud`) and commands (`acespec demo`) both start
`python -m acespec ...` children; they do it here, once.

A child is started with the safe path (`python -P`): the working directory is not put on
`sys.path`. Started from a clone's root, a plain `python -m` would let the repository's
top-level folders (`kernels/`, `models/`, ...) answer imports meant for installed packages
of the same names: transformers 5, for one, imports the PyPI package `kernels`. See
docs/design.md §2.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

SAFE_PATH_VAR = "PYTHONSAFEPATH"  # Python >= 3.11: the interpreter's -P, for whole trees


def python_module(module: str) -> list[str]:
    """argv running `module` as `python -m module` in this interpreter, without the working
    directory on sys.path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module]
    # 3.10 has no -P: drop the working directory ('' from -c) before running the module.
    boot = ("import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", boot]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 120.0,
              host: str = "127.0.0.1") -> None:
    """Until host:port accepts connections; RuntimeError early if the process died, or at
    `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the {what} did not listen on port {port} within {timeout:.0f} s")


def reap(children: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    """Wait for children that were told to leave; kill one that does not."""
    for child in children:
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
