"""`acespec edge generate --reconnect-deadline S` from the shell: a verifier killed mid-
generation (and not coming back) ends the command within S seconds of the loss, not after
a fixed number of reconnects; the error says it was the deadline."""

from __future__ import annotations

import signal
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from cli_harness import Proc, verifier  # noqa: E402

pytestmark = pytest.mark.slow
DEADLINE_S = 3.0
SLACK_S = 2.0  # the loss is seen when the stream breaks; process exit and teardown


def test_edge_generate_gives_up_at_its_deadline():
    cloud, addr = verifier("--emulate-step-ms", "60")  # slow enough to kill mid-generation
    with cloud, Proc("edge", "generate", "def main():", "--cloud", addr, "--mode", "ar",
                     "--max-tokens", "400", "--reconnect-deadline", str(DEADLINE_S)) as edge:
        edge.wait_for(r"\w", timeout=60)  # text is streaming
        cloud.p.send_signal(signal.SIGKILL)
        cloud.p.wait()
        lost = time.monotonic()
        code = edge.p.wait(timeout=60)
        took = time.monotonic() - lost
        err = edge.stderr
    assert code != 0, err[-2000:]
    assert took <= DEADLINE_S + SLACK_S, (took, err[-2000:])
    assert "reconnect deadline" in err, err[-2000:]
