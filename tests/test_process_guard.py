"""The leak guard itself: it finds what a test left running, kills it, and ignores what ended."""

import os
import subprocess
import sys
import time

from process_guard import TAG, leftovers, tagged


def _start(value: str, seconds: float) -> subprocess.Popen:
    env = {**os.environ, TAG: value}
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], env=env)


def _visible(value: str, pid: int, timeout_s: float = 10.0) -> None:
    """Wait until the kernel shows `pid`'s new environment: Popen returns once exec has begun,
    a moment before /proc/PID/environ points at the new process's strings."""
    deadline = time.monotonic() + timeout_s
    while pid not in tagged(value):
        assert time.monotonic() < deadline, f"process {pid} never showed {TAG}={value}"
        time.sleep(0.05)


def test_a_process_left_running_is_named_and_killed():
    p = _start("guard-test-leak", 60)
    _visible("guard-test-leak", p.pid)
    left = leftovers("guard-test-leak", grace_s=0.5)
    assert list(left) == [p.pid] and "time.sleep(60)" in left[p.pid]
    assert p.wait(timeout=5) == -9


def test_a_process_that_ends_within_the_grace_is_not_counted():
    p = _start("guard-test-ends", 0.5)
    assert leftovers("guard-test-ends", grace_s=5) == {}
    p.wait(timeout=5)
