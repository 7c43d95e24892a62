"""`acespec demo`: real child processes (verifier, link emulator), the edge in-process; the
side-by-side table, and every child and its log gone afterwards - also after Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead for our purposes
        return f.read().split()[2] != "Z"


def _demo(tiny_hf_dir, gguf, *extra, step_ms="0"):
    return [sys.executable, "-m", "acespec", "demo", "--model", str(tiny_hf_dir), "--drafter",
            str(gguf), "--link", "1mbit:10ms", "--emulate-step-ms", step_ms, *extra]


@pytest.mark.slow
def test_demo_prints_both_modes_and_cleans_up(tiny_hf_dir, tiny_pair, tmp_path):
    gguf = tiny_pair[2]["q8_0"]
    p = subprocess.run(_demo(tiny_hf_dir, gguf, "--max-tokens", "16"), capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "| figure | acespec-gap | ar |" in p.stdout and "acespec-gap / ar:" in p.stdout
    assert "| None | None |" not in p.stdout  # a figure neither mode measured has no row
    pids = [int(x) for x in re.findall(r"started the .*? \(pid (\d+)", p.stderr)]
    assert len(pids) == 2 and not any(_alive(x) for x in pids)
    assert str(tmp_path) in p.stderr  # the children's logs were there while they ran ...
    assert not list(tmp_path.glob("acespec-demo-*"))  # ... and went with them


@pytest.mark.slow
def test_ctrl_c_stops_every_child(tiny_hf_dir, tiny_pair, tmp_path):
    gguf = tiny_pair[2]["q8_0"]
    # 100 ms passes: the tiny target's context (a few hundred tokens) then lasts long past
    # the interrupt however fast the speculation goes.
    # A terminal's Ctrl-C: the demo starts with SIGINT's default disposition even where the
    # test runner inherited it ignored (a CI script started with `&` ignores SIGINT, and a
    # Python started so keeps ignoring it, as it should).
    p = subprocess.Popen(_demo(tiny_hf_dir, gguf, "--max-tokens", "4000", step_ms="100"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp_path)},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, pids = "", []
    deadline = time.monotonic() + 120
    while "streaming through the link" not in seen and time.monotonic() < deadline:
        seen += p.stderr.readline()
    pids = [int(x) for x in re.findall(r"started the .*? \(pid (\d+)", seen)]
    assert len(pids) == 2 and all(_alive(x) for x in pids)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted; cleaning up" in err
    assert not any(_alive(x) for x in pids)
    assert not list(tmp_path.glob("acespec-demo-*"))  # nor their logs
