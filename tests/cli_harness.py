"""Commands as a user runs them: the installed `acespec` script in a child process, its
output in files (a full pipe never blocks it), stopped by a signal like a user's Ctrl-C or
a service manager's SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from conftest import free_port

ACESPEC = str(Path(sys.executable).with_name("acespec"))  # the console script of this venv


def acespec(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run `acespec ARGS...` to completion; text output captured."""
    return subprocess.run([ACESPEC, *args], capture_output=True, text=True, timeout=timeout,
                          **kw)


class Proc:
    """A long-running `acespec ...` (a server): start, wait for a line, signal, wait."""

    def __init__(self, *args: str, env: dict | None = None, prefix: tuple[str, ...] = ()):
        """`prefix` runs it through another command (e.g. `ip netns exec NAME`)."""
        self.dir = tempfile.TemporaryDirectory(prefix="acespec-proc-")
        self.out_path = Path(self.dir.name) / "stdout"
        self.err_path = Path(self.dir.name) / "stderr"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.p = subprocess.Popen([*prefix, ACESPEC, *args], stdout=out, stderr=err,
                                      env={**os.environ, **(env or {})})

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        """The first match of `pattern` in stdout+stderr; fails if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.stdout + self.stderr)
            if m:
                return m
            if self.p.poll() is not None:
                raise AssertionError(f"exited {self.p.returncode} before {pattern!r}:\n"
                                     f"{self.stdout[-2000:]}\n{self.stderr[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.stderr[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> tuple[int, float]:
        """Send `sig`; returns (exit code, seconds it took to exit). Kills it on timeout."""
        t0 = time.monotonic()
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            code = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError(f"still running {timeout} s after signal {sig}:\n"
                                 f"{self.stderr[-3000:]}") from None
        return code, time.monotonic() - t0

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def kill(self) -> None:
        """SIGKILL (a crash, a pulled plug) if it still runs; its output goes."""
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.dir.cleanup()


def verifier_at(port: int, *extra: str, env: dict | None = None) -> Proc:
    """`acespec cloud serve` on a fixed port (so it can be killed and started again there),
    once it listens."""
    proc = Proc("cloud", "serve", "--host", "127.0.0.1", "--port", str(port), *extra, env=env)
    proc.wait_for(r"listening on")
    return proc


def verifier(*extra: str) -> tuple[Proc, str]:
    """`acespec cloud serve --host 127.0.0.1 --port 0 ...`: (process, 'host:port')."""
    proc = Proc("cloud", "serve", "--host", "127.0.0.1", "--port", "0", *extra)
    m = proc.wait_for(r"listening on ([\d.]+:\d+)")
    return proc, m.group(1)


def scrape(text: str, name: str, **labels: str) -> float:
    """A sample's value in a /metrics page's Prometheus text (0 when absent: a label pair
    never used)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and s.labels == labels)


def generate_json(cloud: str, prompt: str, *flags: str) -> dict:
    """`acespec edge generate PROMPT --cloud CLOUD FLAGS... --json`: its answer, which must
    exit 0."""
    p = acespec("edge", "generate", prompt, "--cloud", cloud, *flags, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


@contextlib.contextmanager
def edge_serve(cloud: str, *flags: str, verbose: bool = False) -> Iterator[tuple[str, Proc]]:
    """`acespec [-v] edge serve --cloud CLOUD --port PORT FLAGS...` once /health answers:
    yields (its base URL, the process), stopped by SIGTERM at the end."""
    port = free_port()
    with Proc(*(["-v"] if verbose else []), "edge", "serve", "--cloud", cloud, "--port",
              str(port), *flags) as edge:
        url = f"http://127.0.0.1:{port}"
        try:
            edge.wait_for(r"acespec edge listening")
            wait_http(f"{url}/health")
            yield url, edge
        finally:
            edge.stop(timeout=20)


def wait_http(url: str, timeout: float = 60) -> None:
    """Poll GET url until it answers 200."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout} s")
