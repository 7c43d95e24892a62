"""Processes a test leaves behind: every test runs with ACESPEC_TEST_NODE set to its own id,
which the processes it starts inherit; whatever still carries that id after the test (and a
short grace) is killed and named, and the test fails. Fixtures that outlive one test are set
up outside that window, so their servers are not counted against it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TAG = "ACESPEC_TEST_NODE"


def tagged(value: str) -> dict[int, str]:
    """pid -> command line of live processes whose environment has TAG=value."""
    want, found = f"{TAG}={value}".encode(), {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if want in (d / "environ").read_bytes().split(b"\0"):
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if cmd:  # a zombie has none: it is gone, only not yet reaped
                    found[int(d.name)] = cmd.strip()
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found


def leftovers(value: str, grace_s: float = 5.0) -> dict[int, str]:
    """The tagged processes still alive after `grace_s`, killed before returning."""
    deadline = time.monotonic() + grace_s
    while (left := tagged(value)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def _stat(proc_dir: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (the state, then the parent's
    pid, ...); None when the process is gone."""
    try:
        return (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    fields = _stat(Path(f"/proc/{pid}"))
    return fields is not None and fields[0] != "Z"


def children(parent: int) -> list[int]:
    """The live processes whose parent is `parent`."""
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()
            and (f := _stat(d)) is not None and int(f[1]) == parent and f[0] != "Z"]
