"""The verifier against careless and hostile clients, each at the level a client reaches
it: a real verifier on a loopback socket, or `acespec cloud serve` as a process. Every wait
is a bounded poll."""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

import grpc
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from acespec.cloud.serving.server import ServerConfig  # noqa: E402
from acespec.cloud.target.config import ModelArgs  # noqa: E402
from acespec.cloud.target.model import Transformer  # noqa: E402
from acespec.cloud.verify.batcher import StepEmulation  # noqa: E402
from acespec.cloud.verify.engine import Limits  # noqa: E402
from acespec.edge.client import CloudSession  # noqa: E402
from acespec.proto import PROTOCOL_VERSION  # noqa: E402
from acespec.proto import acespec_pb2 as pb  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams, served, tail_draws  # noqa: E402

from conftest import free_port, plain_greedy  # noqa: E402
from verifier_harness import channel, run, running_verifier  # noqa: E402

VH = "v1:hardening"
ARGS = ModelArgs(arch="llama", vocab_size=320, hidden_size=64, intermediate_size=128,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
GREEDY = ServeParams()
PROMPT = [3, 14, 15, 92, 65, 35]
POOL_BLOCKS = 64  # a fresh model's page pool (16 slots per block)


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)
    return Transformer(ARGS).eval()


def fresh(model, **args) -> Transformer:
    """A copy with an empty page pool of its own (and args changed, e.g. the context)."""
    m = copy.deepcopy(model)
    if args:
        m.args = replace(m.args, **args)
    return m


async def poll(cond, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


def session_call(ch):
    return ch.stream_stream("/acespec.v1.Verifier/Session",
                            request_serializer=pb.Uplink.SerializeToString,
                            response_deserializer=pb.Downlink.FromString)()


def generate_call(ch, prompt, max_tokens):
    stub = ch.unary_stream("/acespec.v1.Verifier/Generate",
                           request_serializer=pb.GenerateRequest.SerializeToString,
                           response_deserializer=pb.GenerateChunk.FromString)
    return stub(pb.GenerateRequest(protocol_version=PROTOCOL_VERSION, vocab_hash=VH,
                                   prompt_tokens=prompt, max_tokens=max_tokens))


def open_msg(prompt, **sampling):
    return pb.Uplink(open=pb.Open(protocol_version=PROTOCOL_VERSION, vocab_hash=VH,
                                  prompt_tokens=prompt, sampling=pb.Sampling(**sampling)))


async def status_of(call) -> tuple[str, str]:
    """Read what is left of a call; its final (code name, details)."""
    try:
        while await call.read() is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError:
        pass
    return (await call.code()).name, await call.details()


def metric(engine, name: str, **labels) -> float:
    return engine.metrics.registry.get_sample_value(name, labels) or 0.0


# -- 1. the KV pool must not be poisoned by growing under inference mode ----------------


def test_a_long_prompt_growing_the_pool_leaves_other_sessions_committing(base_model):
    model = fresh(base_model)
    long_prompt = [(7 * i) % ARGS.vocab_size for i in range(1500)]  # > the pool's 1024 slots

    async def go():
        async with running_verifier(model, VH) as (_, addr), channel(addr) as ch:
            a = CloudSession(ch)
            root = await a.open(PROMPT, GREEDY, 0, VH)
            first = await a.extend([root.greedy_token])
            s1 = await a.recv()
            b = CloudSession(ch)
            await b.open(long_prompt, GREEDY, 0, VH)  # the pool grows inside forward_batch
            grown = model._pool.n_blocks
            await a.extend([s1[0].greedy_token], commit=first)  # retain, outside that mode
            s2 = await a.recv()
            await a.close()
            await b.close()
            return grown, [root.greedy_token, s1[0].greedy_token, s2[0].greedy_token]

    grown, tokens = run(go())
    assert grown > POOL_BLOCKS
    assert tokens == plain_greedy(model, PROMPT, 3)


# -- 3. a client that never reads -----------------------------------------------------


FLOOD = dict(temperature=5.0, send_mass=1.0, k_max=320)  # every entry sent: ~10 KB a Scores


async def flood(addr, extends: int = 40):
    """A client that opens a session and sends Extends (16 siblings each, committing one;
    ~15 KB of Scores each) without reading: (channel, call, writer task). Its channel leaves
    the HTTP/2 window at 64 KB, as the edge's does (no BDP probing). All its Extends fit the
    verifier's read-ahead, so none of its own writes is pending when the call ends."""
    ch = grpc.aio.insecure_channel(addr, options=[("grpc.http2.bdp_probe", 0)])
    call = session_call(ch)
    await call.write(open_msg(PROMPT, **FLOOD))

    async def writer():
        for k in range(extends):
            parent = 16 * k  # the root, then the last node of the previous Extend
            ext = pb.Extend(tokens=[5] * 16, branch_index=range(1, 16), branch_parent=[parent] * 15)
            if k:
                ext.commit = parent
            try:
                await call.write(pb.Uplink(extend=ext))
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return  # the call has ended

    return ch, call, asyncio.create_task(writer())


def down_bytes(engine) -> float:
    return metric(engine, "acespec_message_bytes_total", direction="down")


def test_a_client_that_never_reads_is_ended_and_its_slot_freed(base_model, caplog):
    cfg = ServerConfig(write_timeout_s=0.5, limits=Limits(max_sessions=2))

    async def go():
        async with running_verifier(fresh(base_model), VH, cfg) as (engine, addr):
            hostile = [await flood(addr) for _ in range(2)]  # fill --max-sessions 2
            await poll(lambda: down_bytes(engine) > 2 * 65536, what="the downlinks to fill")
            await poll(lambda: engine.active == 0, what="the blocked sessions to end")
            async with channel(addr) as ch:  # a real client gets in again
                s = CloudSession(ch)
                root = await s.open(PROMPT, GREEDY, 0, VH)
                await s.close()
            statuses = []
            for ch, call, writer in hostile:
                statuses.append(await status_of(call))  # reading now, it gets its status
                await writer
                await ch.close()
            return root.greedy_token, statuses, metric(engine, "acespec_errors_total",
                                                         code="DEADLINE_EXCEEDED")

    with caplog.at_level(logging.INFO):
        token, statuses, deadline_errors = run(go())
    assert token == plain_greedy(base_model, PROMPT, 1)[0]
    for code, details in statuses:
        assert code == "DEADLINE_EXCEEDED" and "--write-timeout" in details, details
    assert deadline_errors == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.parametrize("when", ["blocked", "after_timeout"])
def test_a_cancel_from_a_client_that_never_reads_is_quiet(base_model, caplog, when):
    """Cancelled while the verifier waits to write, or after the write timeout while the
    status waits behind the unread data: one info line, no error metric, no traceback."""
    cfg = ServerConfig(write_timeout_s=0.5 if when == "after_timeout" else 60.0)

    async def go():
        async with running_verifier(fresh(base_model), VH, cfg) as (engine, addr):
            ch, call, writer = await flood(addr)
            await poll(lambda: down_bytes(engine) > 65536, what="the downlink to fill")
            if when == "after_timeout":
                await poll(lambda: engine.active == 0, what="the write timeout")
            else:  # blocked: the verifier has stopped sending
                sent = -1.0
                while sent != down_bytes(engine):
                    sent = down_bytes(engine)
                    await asyncio.sleep(0.2)
            call.cancel()
            await writer
            await poll(lambda: engine.active == 0, what="the session to be freed")
            await ch.close()
            await asyncio.sleep(0.1)  # let the server's call task see the cancel
            return {code: metric(engine, "acespec_errors_total", code=code)
                    for code in ("INTERNAL", "UNKNOWN", "CANCELLED")}

    with caplog.at_level(logging.INFO):
        errors = run(go())
    assert not any(errors.values()), errors
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, caplog.text
    assert any("client" in r.getMessage() for r in caplog.records)


# -- 4. MoreTail: O(count) per call, bounded per node ----------------------------------


def test_tail_sample_n_is_drawn_without_the_ones_before_it():
    d = served(np.log([0.6, 0.2, 0.1, 0.06, 0.04]), ServeParams(SamplingParams(temperature=1.0)))
    ids, units = tail_draws(d, 1, seed=9, position=3, start=0, count=64)
    for start in (1, 2, 3, 4, 5, 17, 59):  # any offset continues the same stream
        more, more_units = tail_draws(d, 1, seed=9, position=3, start=start, count=5)
        assert more.tolist() == ids[start:start + 5].tolist()
        assert more_units.tolist() == units[start:start + 5].tolist()
    # Sample 2**50 costs what sample 0 does (a stream that replays its prefix would need
    # petabytes here).
    far, far_units = tail_draws(d, 1, seed=9, position=3, start=2**50, count=4)
    assert len(far) == 4 and set(far.tolist()) <= set(d.ids[1:].tolist())
    assert far_units.tolist() == [d.units_of(int(t)) for t in far]


def test_more_tail_is_bounded_per_node(base_model):
    cfg = ServerConfig(limits=Limits(max_tail_per_node=130))
    params = ServeParams(SamplingParams(temperature=1.0), send_mass=0.5)  # m = 2 pre-drawn

    async def go():
        async with running_verifier(fresh(base_model), VH, cfg) as (_, addr), \
                channel(addr) as ch:
            s = CloudSession(ch)
            root = await s.open(PROMPT, params, 1, VH)
            assert root.tail_units > 0
            got = []
            for n in (64, 64):  # 2 + 128 = 130: still within the bound
                await s.more_tail(0, n)
                got.append(len((await s.recv()).ids))
            await s.more_tail(0, 1)
            try:
                await s.recv()
                return got, None
            except grpc.aio.AioRpcError as e:
                return got, (e.code().name, e.details())

    got, err = run(go())
    assert got == [64, 64]
    assert err[0] == "RESOURCE_EXHAUSTED" and "max_tail_per_node=130" in err[1], err


# -- 5. Generate counts as a session; the pool gives memory back -----------------------


def test_generate_counts_against_max_sessions_and_stops_when_cancelled(base_model):
    model = fresh(base_model)
    cfg = ServerConfig(limits=Limits(max_sessions=2), emulation=StepEmulation(5.0))
    prompt = [(3 * i) % ARGS.vocab_size for i in range(100)]

    async def go():
        async with running_verifier(model, VH, cfg) as (engine, addr), \
                channel(addr) as ch:
            running = [generate_call(ch, prompt, 1000) for _ in range(2)]
            for call in running:
                assert (await call.read()).tokens  # both are decoding
            active = (engine.active, metric(engine, "acespec_sessions_active"))
            grown = model._pool.n_blocks  # each reserved KV for 1,100 positions
            third = await status_of(generate_call(ch, prompt, 5))
            opened = await status_of(_opening(ch))
            for call in running:
                call.cancel()
            await poll(lambda: engine.active == 0, what="the cancelled Generates to end")
            await poll(lambda: model._pool.n_blocks == POOL_BLOCKS, what="the pool to shrink")
            scored = engine.batcher.requests_scored
            chunks = [c async for c in generate_call(ch, prompt, 3)]
            extra = engine.batcher.requests_scored - scored  # the cancelled ones score nothing
            return active, grown, third, opened, chunks, extra

    active, grown, third, opened, chunks, extra = run(go())
    assert active == (2, 2.0)
    assert grown > POOL_BLOCKS
    for code, details in (third, opened):
        assert code == "RESOURCE_EXHAUSTED" and "max_sessions=2" in details, details
    assert sum(len(c.tokens) for c in chunks) == 3 and chunks[-1].done
    assert extra == 3  # prefill + 2 decode steps of the new Generate only


def _opening(ch):
    call = session_call(ch)

    async def write_open():
        await call.write(open_msg(PROMPT))
        await call.done_writing()

    asyncio.get_running_loop().create_task(write_open())
    return call


# -- 7. the model's context bounds sessions and Generate --------------------------------


def test_context_limit_refuses_extend_and_bounds_generate(base_model):
    model = fresh(base_model, max_position_embeddings=48)
    prompt = [(5 * i) % ARGS.vocab_size for i in range(40)]  # positions 0..39

    async def go():
        async with running_verifier(model, VH) as (_, addr), channel(addr) as ch:
            s = CloudSession(ch)
            await s.open(prompt, GREEDY, 0, VH)
            await s.extend([5] * 8)  # positions 40..47: the last ones the model has
            fits = len(await s.recv())
            await s.extend([5], commit=8)  # position 48
            try:
                await s.recv()
                refused = None
            except grpc.aio.AioRpcError as e:
                refused = (e.code().name, e.details())
            too_many = await status_of(generate_call(ch, prompt, 9))
            exact = [t for c in [c async for c in generate_call(ch, prompt, 8)] for t in c.tokens]
            unset = [t for c in [c async for c in generate_call(ch, prompt, 0)] for t in c.tokens]
            return fits, refused, too_many, exact, unset

    fits, refused, too_many, exact, unset = run(go())
    assert fits == 8
    assert refused[0] == "OUT_OF_RANGE", refused
    assert "position 48" in refused[1] and "max_position_embeddings=48" in refused[1]
    assert too_many[0] == "OUT_OF_RANGE" and "at most 8" in too_many[1], too_many
    assert len(exact) == 8 and unset == exact  # unset max_tokens: what the context has room for


# -- 9, 10. `acespec cloud serve`: clear bind errors, ports, metrics host ---------------


def serve_cmd(model_dir, *extra) -> list[str]:
    return [sys.executable, "-m", "acespec", "cloud", "serve", "--model", str(model_dir),
            *extra]


def assert_clear_error(proc, text: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and text in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("tls")
    key, cert = out / "key.pem", out / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost"], check=True,
                   capture_output=True)
    return cert, key


@pytest.mark.slow
@pytest.mark.parametrize("case", ["swapped_tls", "bad_host", "port_70000", "metrics_70000"])
def test_serve_refuses_bad_addresses_with_one_line(tiny_hf_dir, tls_pair, case):
    cert, key = tls_pair
    extra, text = {
        "swapped_tls": (["--port", "0", "--tls-cert", str(key), "--tls-key", str(cert)],
                        "swapped?"),
        "bad_host": (["--host", "999.1.1.1", "--port", "0"], "could not listen on 999.1.1.1"),
        "port_70000": (["--port", "70000"], "'70000' is not a port number (0..65535)"),
        "metrics_70000": (["--port", "0", "--metrics-port", "70000"],
                          "'70000' is not a port number"),
    }[case]
    proc = subprocess.run(serve_cmd(tiny_hf_dir, *extra), capture_output=True, text=True,
                          timeout=60)
    assert_clear_error(proc, text)
    assert len([ln for ln in proc.stderr.splitlines() if "error" in ln]) == 1, proc.stderr


@pytest.mark.slow
def test_serve_on_a_busy_port_fails_instead_of_sharing_it(base_model, tiny_hf_dir):
    async def go():
        async with running_verifier(fresh(base_model), VH) as (_, addr):
            port = addr.rsplit(":", 1)[1]
            return await asyncio.to_thread(
                subprocess.run, serve_cmd(tiny_hf_dir, "--host", "127.0.0.1", "--port", port),
                capture_output=True, text=True, timeout=60)

    proc = run(go())
    assert_clear_error(proc, "could not listen on 127.0.0.1:")


@pytest.mark.slow
def test_metrics_listen_on_the_serve_host_only(tiny_hf_dir):
    mport = free_port()
    proc = subprocess.Popen(serve_cmd(tiny_hf_dir, "--host", "127.0.0.1", "--port", "0",
                                      "--metrics-port", str(mport)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert re.search(r"listening on 127\.0\.0\.1:\d+", line), \
            (line, proc.stderr.read() if proc.poll() is not None else "")
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as r:
            assert b"acespec_sessions_active" in r.read()
        with pytest.raises(OSError):  # another loopback address: nothing listens there
            socket.create_connection(("127.0.0.2", mport), timeout=5).close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
