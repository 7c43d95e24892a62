"""`acespec cloud serve` as a real process: starts, reports health, serves, drains on SIGTERM;
and the load tool's correctness and byte accounting."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from acespec.edge.client import channel, generate  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import run, running_verifier  # noqa: E402


@pytest.fixture(scope="module")
def hf_target(tiny_pair, tiny_hf_dir):
    return tiny_hf_dir, Tokenizer.load(tiny_pair[0])


@pytest.mark.slow
def test_serve_process_health_generate_and_graceful_stop(hf_target):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    path, tok = hf_target
    proc = subprocess.Popen([sys.executable, "-m", "acespec", "cloud", "serve", "--model",
                             str(path), "--host", "127.0.0.1", "--port", "0", "--grace", "2",
                             "--emulate-step-ms", "1,0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on ([\d.]+:\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        addr = m.group(1)

        async def go():
            async with channel(addr) as ch:
                h = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
                toks = [t async for t in generate(ch, tok.encode("x = 1\n"), ServeParams(), 0, 5,
                                                  tok.vocab_hash())]
                return h.status, toks

        status, toks = run(go())
        assert status == health_pb2.HealthCheckResponse.SERVING and len(toks) == 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        err = proc.stderr.read()
        assert "TESTBED" in err and "draining" in err and "verifier stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_bad_flags_are_clear_errors(hf_target, tmp_path):
    path, _ = hf_target
    empty = tmp_path / "tokens"
    empty.write_text("\n")
    for extra, text in ((["--auth-token-file", str(empty)], "holds no tokens"),
                        (["--emulate-step-ms", "-3"], "T0[,PER_NODE[,KNEE]]"),
                        (["--tls-cert", str(empty)], "both --tls-cert and --tls-key")):
        proc = subprocess.run([sys.executable, "-m", "acespec", "cloud", "serve", "--model",
                               str(path), "--port", "0", *extra], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_loadtest_checks_correctness_and_counts_bytes(tiny_pair):
    from acespec.sim.loadtest import run_load

    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    prompts = [tok.encode("import os\n"), tok.encode("def f(x):\n")]

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            return await run_load(addr, prompts, tok.vocab_hash(), 4, 5, 3, ServeParams())

    res = run(go())
    assert res.correct_sessions == 4 and res.nodes_scored == 4 * 5 * 3
    assert res.wire_bytes_up > 0 and res.wire_bytes_down > 0
    assert res.latency_p99_ms >= res.latency_p50_ms > 0
    asyncio.get_event_loop_policy()  # (the loop above is closed; nothing leaks)
