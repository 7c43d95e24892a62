"""The edge's reconnect deadline bounds the whole outage, attempts included: a verifier
killed mid-generation is given up within the deadline whether its address then refuses
connections or leads to a replica that accepts the session and does not answer in time
(a wedged verifier: here one whose passes take 20 s). Before any session opened,
connect_timeout_s bounds the first connection alike, even to a socket that accepts TCP
and never speaks HTTP/2."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import free_port

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.edge.client import channel  # noqa: E402
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig  # noqa: E402
from acespec.edge.session import EdgeEngine, EngineConfig  # noqa: E402
from acespec.models import DEMO_DRAFTER, DEMO_TARGET  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

DEADLINE_S = 3.0
SLACK_S = 1.5  # a bound, not a speed target


@pytest.fixture(scope="module")
def drafter():
    return LlamaDrafter(str(DEMO_DRAFTER), LlamaDrafterConfig(n_ctx=1024, n_seq_max=8))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.load(DEMO_TARGET)


@contextlib.contextmanager
def verifier(step_ms: str):
    """`cloud serve` on the demo target with passes padded to step_ms: its 'host:port'."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "acespec", "cloud", "serve", "--host",
                             "127.0.0.1", "--port", str(port), "--emulate-step-ms", step_ms],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert re.search(r"listening on", line), line
        yield proc, f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def given_up(engine: EdgeEngine, prompt: list[int], cfg: EngineConfig,
                   on_tokens=None) -> ConnectionError:
    try:
        await engine.generate(prompt, cfg, on_tokens)
    except ConnectionError as e:
        return e
    raise AssertionError("the generation finished without a verifier")


@pytest.mark.slow
@pytest.mark.parametrize("then,mode", [("refused", "acespec"), ("wedged", "acespec"),
                                       ("wedged", "pipeline"), ("wedged", "ar")])
def test_a_verifier_that_goes_away_is_given_up_within_the_deadline(drafter, tok, then,
                                                                   mode):
    cfg = EngineConfig(mode=mode, max_tokens=400, reconnect_deadline_s=DEADLINE_S,
                       backoff_s=0.1)
    with contextlib.ExitStack() as stack:
        first, addr = stack.enter_context(verifier("60"))
        wedged = stack.enter_context(verifier("20000"))[1] if then == "wedged" else addr
        target, gone = [addr], []

        def on_tokens(ids, stats):
            if stats.tokens >= 5 and not gone:
                first.kill()
                first.wait()
                gone.append(time.monotonic())
                target[0] = wedged  # where the edge's next connection goes

        engine = EdgeEngine(lambda: channel(target[0]), tok.vocab_hash(), drafter)
        err = asyncio.run(asyncio.wait_for(
            given_up(engine, tok.encode("def parse_args(argv):\n"), cfg, on_tokens), 120))
        took = time.monotonic() - gone[0]
    assert str(err).startswith(f"verifier unreachable for {DEADLINE_S:g} s (reconnect "
                               "deadline; "), err
    assert took <= DEADLINE_S + SLACK_S, (took, str(err))
    print(f"{mode}, then {then}: gave up {took:.2f} s after the verifier went away")


@pytest.mark.slow
def test_a_black_hole_is_given_up_within_the_connect_timeout(drafter, tok):
    cfg = EngineConfig(mode="acespec", max_tokens=8, connect_timeout_s=DEADLINE_S)
    with socket.socket() as hole:  # the kernel completes handshakes; nobody reads
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        addr = f"127.0.0.1:{hole.getsockname()[1]}"
        engine = EdgeEngine(lambda: channel(addr), tok.vocab_hash(), drafter)
        t0 = time.monotonic()
        err = asyncio.run(asyncio.wait_for(given_up(engine, tok.encode("x"), cfg), 60))
        took = time.monotonic() - t0
    assert str(err).startswith(f"no connection within {DEADLINE_S:g} s"), err
    assert took <= DEADLINE_S + SLACK_S, (took, str(err))
