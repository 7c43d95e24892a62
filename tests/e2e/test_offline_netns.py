"""--offline through a real interface going down: the verifier in a network namespace behind
a tc-shaped veth (acespec.sim.netns), `edge generate` in the root namespace, and the veth set
down for 6 s mid-answer (`ip link set ... down`: no packet crosses, no connection is reset).
Both modes end on cloud-only decoding's text. Runs where namespaces can be made (root,
iproute2); elsewhere it skips and says why (tests/e2e/test_offline_link.py covers the same
outages through the link emulator everywhere)."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("torch")

from acespec.sim.netns import NetnsLink, available  # noqa: E402

from cli_harness import Proc, acespec  # noqa: E402

WHY = available()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=f"network namespaces: {WHY}")]
PROMPT, PORT = "def fibonacci(n):", 50051


@pytest.fixture(scope="module")
def wan():
    """(namespace link, verifier address, cloud-only text of 300 tokens)."""
    with NetnsLink(2e6, 2e6, name="acespec-off") as ns:
        with Proc("cloud", "serve", "--host", ns.cloud_ip, "--port", str(PORT),
                  "--emulate-step-ms", "40", prefix=tuple(ns.argv_in_ns([]))) as cloud:
            cloud.wait_for(r"listening on")
            addr = f"{ns.cloud_ip}:{PORT}"
            r = acespec("edge", "generate", PROMPT, "--cloud", addr, "--mode", "ar",
                        "--max-tokens", "300", "--json", timeout=180)
            assert r.returncode == 0, r.stderr
            yield ns, addr, json.loads(r.stdout)["text"]


@pytest.mark.parametrize("offline", ["wait", "local"])
def test_generate_rides_out_the_interface_going_down(wan, offline):
    ns, addr, ref = wan
    with Proc("edge", "generate", PROMPT, "--cloud", addr, "--offline", offline,
              "--max-tokens", "300", "--json") as edge:
        time.sleep(3)  # loading the drafter, then mid-answer
        assert edge.p.poll() is None, edge.stderr
        with ns.outage(6):  # past the stall threshold of both modes
            pass
        assert edge.p.wait(180) == 0, edge.stderr
        out, err = json.loads(edge.stdout), edge.stderr
    s = out["stats"]
    assert out["text"] == ref, err
    assert s["outages"] >= 1, s
    if offline == "local":
        assert s["unverified_tokens"] > 0
    assert "Traceback" not in err
