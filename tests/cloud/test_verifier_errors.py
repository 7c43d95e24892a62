"""Bad input ends only the offending session, with a specific status code and a message
naming the problem, while a healthy session alongside completes correctly. Auth and TLS."""

from __future__ import annotations

import asyncio
import subprocess

import grpc
import pytest

torch = pytest.importorskip("torch")

from acespec.cloud.serving.server import ServerConfig, create_server  # noqa: E402
from acespec.cloud.verify.batcher import StepEmulation  # noqa: E402
from acespec.cloud.verify.engine import Engine, Limits  # noqa: E402
from acespec.edge.client import CloudSession, generate  # noqa: E402
from acespec.proto import PROTOCOL_VERSION  # noqa: E402
from acespec.proto import acespec_pb2 as pb  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import channel, run, running_verifier  # noqa: E402

GREEDY = ServeParams()
CFG = ServerConfig(limits=Limits(max_sessions=6, max_live_nodes=8, max_prompt_tokens=64))


@pytest.fixture(scope="module")
def target(tiny_pair):
    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    prompt = tok.encode("def main():\n")
    seq = list(prompt)
    for _ in range(12):
        seq.append(int(model(seq, model.new_cache(), last_only=True)[0].argmax()))
    return model, tok.vocab_hash(), prompt, seq[len(prompt):]


async def healthy(addr, vh, prompt, expected):
    """Greedy decoding by verifying the target's own argmax chain, 3 tokens per Extend."""
    async with channel(addr) as ch:
        s = CloudSession(ch)
        root = await s.open(prompt, GREEDY, 0, vh)
        out, last = [root.greedy_token], root
        while len(out) < len(expected):
            # Extend with what the previous scores predicted, then a guess chain.
            first = await s.extend([out[-1]])
            scores = await s.recv()
            await s.commit(first)
            out.append(scores[-1].greedy_token)
            last = scores[-1]
            await asyncio.sleep(0.005)
        assert last.node_id > 0
        await s.close()
        return out[:len(expected)]


def raw_call(ch):
    return ch.stream_stream("/acespec.v1.Verifier/Session",
                            request_serializer=pb.Uplink.SerializeToString,
                            response_deserializer=pb.Downlink.FromString)()


def open_msg(prompt, vh, version=PROTOCOL_VERSION, **kw):
    return pb.Uplink(open=pb.Open(protocol_version=version, vocab_hash=vh,
                                  prompt_tokens=prompt, **kw))


def ext(tokens, idx=(), par=()):
    return pb.Uplink(extend=pb.Extend(tokens=tokens, branch_index=idx, branch_parent=par))


def bad_cases(vh, prompt):
    o = open_msg(prompt, vh)
    return {
        "token outside vocab": ([o, ext([10, 99999])], "INVALID_ARGUMENT", "outside the vocabulary"),
        "parent not live": ([o, ext([5, 6]), pb.Uplink(commit=pb.Commit(node_id=2)),
                             ext([7], [0], [1])], "INVALID_ARGUMENT", "parent 1 of node 3 is not a live"),
        "extend before open": ([ext([5])], "FAILED_PRECONDITION", "extend before Open"),
        "commit before open": ([pb.Uplink(commit=pb.Commit(node_id=0))], "FAILED_PRECONDITION",
                               "commit before Open"),
        "newer protocol": ([open_msg(prompt, vh, version=PROTOCOL_VERSION + 1)],
                           "FAILED_PRECONDITION",
                           f"edge speaks protocol {PROTOCOL_VERSION + 1}, this verifier speaks "
                           f"{PROTOCOL_VERSION}; upgrade the verifier"),
        "older protocol": ([open_msg(prompt, vh, version=PROTOCOL_VERSION - 1,
                                     decide=pb.Decide(max_tokens=4))], "FAILED_PRECONDITION",
                           f"edge speaks protocol {PROTOCOL_VERSION - 1}, this verifier speaks "
                           f"{PROTOCOL_VERSION}; upgrade the edge"),
        "vocab mismatch": ([open_msg(prompt, "v1:deadbeefdeadbeef")], "FAILED_PRECONDITION",
                           "vocab_hash mismatch: edge v1:deadbeefdeadbeef"),
        "oversize prompt": ([open_msg(list(range(2, 80)), vh)], "RESOURCE_EXHAUSTED",
                            "exceeds max_prompt_tokens=64"),
        "too many live nodes": ([o, ext(list(range(2, 11)))], "RESOURCE_EXHAUSTED",
                                "max_live_nodes=8"),
        "branch arrays": ([o, ext([5, 6], [1, 0], [0])], "INVALID_ARGUMENT",
                          "branch_index has 2 entries"),
        "branch parent in future": ([o, ext([5, 6], [1], [7])], "INVALID_ARGUMENT",
                                    "not an earlier node"),
        "more tail n": ([o, pb.Uplink(more_tail=pb.MoreTail(node_id=0, n=0))],
                        "INVALID_ARGUMENT", "MoreTail.n"),
        "bad sampling": ([open_msg(prompt, vh, sampling=pb.Sampling(temperature=1, top_p=2))],
                         "INVALID_ARGUMENT", "sampling: top_p"),
        "commit unknown": ([o, pb.Uplink(commit=pb.Commit(node_id=42))], "NOT_FOUND",
                           "node 42 is not live"),
        "empty uplink": ([o, pb.Uplink()], "INVALID_ARGUMENT", "empty Uplink"),
        "second open": ([o, o], "FAILED_PRECONDITION", "second Open"),
        "missing vocab hash": ([open_msg(prompt, "")], "FAILED_PRECONDITION", "vocab_hash is required"),
    }


async def expect_error(addr, msgs):
    async with channel(addr) as ch:
        call = raw_call(ch)
        try:
            for m in msgs:
                await call.write(m)
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError:
            pass
        return await call.code(), await call.details()


def test_each_bad_input_fails_only_its_session(target):
    model, vh, prompt, expected = target
    cases = bad_cases(vh, prompt)

    async def go():
        async with running_verifier(model, vh, CFG) as (engine, addr):
            results = {}
            for name, (msgs, code, text) in cases.items():
                good = asyncio.create_task(healthy(addr, vh, prompt, expected[:6]))
                results[name] = (await expect_error(addr, msgs), code, text)
                assert await good == expected[:6], name
            await asyncio.sleep(0.05)
            return results, len(engine.sessions)

    results, leaked = run(go())
    for name, ((code, details), want_code, want_text) in results.items():
        assert code.name == want_code, f"{name}: {code.name} {details}"
        assert want_text in details, f"{name}: {details!r}"
    assert leaked == 0


def test_generate_in_another_protocol_is_refused_naming_both(target):
    """Generate checks the protocol version as Open does: FAILED_PRECONDITION naming the
    edge's and the verifier's, and which side to upgrade."""
    model, vh, prompt, _ = target

    async def call(addr, version):
        async with channel(addr) as ch:
            stub = ch.unary_stream("/acespec.v1.Verifier/Generate",
                                   request_serializer=pb.GenerateRequest.SerializeToString,
                                   response_deserializer=pb.GenerateChunk.FromString)
            try:
                async for _ in stub(pb.GenerateRequest(protocol_version=version, vocab_hash=vh,
                                                       prompt_tokens=prompt, max_tokens=2)):
                    pass
            except grpc.aio.AioRpcError as e:
                return e.code().name, e.details()
            return "OK", ""

    async def go():
        async with running_verifier(model, vh, CFG) as (_, addr):
            return [await call(addr, v) for v in (0, PROTOCOL_VERSION, PROTOCOL_VERSION + 7)]

    old, same, new = run(go())
    assert old == ("FAILED_PRECONDITION", f"edge speaks protocol 0, this verifier speaks "
                   f"{PROTOCOL_VERSION}; upgrade the edge so both speak one protocol")
    assert same == ("OK", "")
    assert new[0] == "FAILED_PRECONDITION" and "upgrade the verifier" in new[1]


def test_disconnect_frees_the_session_and_full_server_refuses(target):
    model, vh, prompt, _ = target

    async def go():
        async with running_verifier(model, vh, CFG) as (engine, addr):
            chans = [channel(addr) for _ in range(6)]
            sessions = [CloudSession(c) for c in chans]
            for s in sessions:
                await s.open(prompt, GREEDY, 0, vh)
            full = await expect_error(addr, [open_msg(prompt, vh)])
            sessions[0].cancel()  # client vanishes mid-stream
            for c in chans[1:]:
                await c.close()
            for _ in range(100):
                if not engine.sessions:
                    break
                await asyncio.sleep(0.02)
            await chans[0].close()
            return full, len(engine.sessions)

    (code, details), left = run(go())
    assert code.name == "RESOURCE_EXHAUSTED" and "max_sessions=6" in details
    assert left == 0


def test_auth_tokens(target):
    model, vh, prompt, _ = target
    cfg = ServerConfig(auth_tokens=frozenset({"s3cret"}))

    async def attempt(addr, token):
        async with channel(addr) as ch:
            try:
                return [t async for t in generate(ch, prompt, GREEDY, 0, 2, vh, token=token)]
            except grpc.aio.AioRpcError as e:
                return e.code().name

    async def go():
        async with running_verifier(model, vh, cfg) as (_, addr):
            return [await attempt(addr, t) for t in (None, "wrong", "s3cret")]

    none, wrong, right = run(go())
    assert none == wrong == "UNAUTHENTICATED" and isinstance(right, list) and len(right) == 2


def test_tls_with_self_signed_cert(target, tmp_path):
    model, vh, prompt, expected = target
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    cfg = ServerConfig(tls_cert=str(cert), tls_key=str(key))

    async def go():
        async with running_verifier(model, vh, cfg) as (_, addr):
            async with channel(addr, tls_root_cert=cert.read_bytes()) as ch:
                ok = [t async for t in generate(ch, prompt, GREEDY, 0, 3, vh)]
            async with channel(addr) as plain:  # plaintext client against a TLS server
                try:
                    [t async for t in generate(plain, prompt, GREEDY, 0, 3, vh)]
                    refused = None
                except grpc.aio.AioRpcError as e:
                    refused = e.code().name
            return ok, refused

    ok, refused = run(go())
    assert ok == expected[:3] and refused == "UNAVAILABLE"


def test_idle_session_is_ended_and_freed(target):
    model, vh, prompt, _ = target
    cfg = ServerConfig(idle_timeout_s=0.3)

    async def go():
        async with running_verifier(model, vh, cfg) as (engine, addr), channel(addr) as ch:
            s = CloudSession(ch)
            await s.open(prompt, GREEDY, 0, vh)
            await asyncio.sleep(0.6)
            try:
                await s.recv()
                err = None
            except grpc.aio.AioRpcError as e:
                err = (e.code().name, e.details())
            return err, len(engine.sessions)

    err, left = run(go())
    assert err[0] == "DEADLINE_EXCEEDED" and "idle" in err[1] and left == 0


def test_graceful_stop_drains_open_sessions_and_refuses_new(target):
    model, vh, prompt, expected = target

    async def go():
        engine = Engine(model, vh, "drain-test")
        server, port = await create_server(engine, ServerConfig(host="127.0.0.1", port=0))
        addr = f"127.0.0.1:{port}"
        async with channel(addr) as ch:
            s = CloudSession(ch)
            root = await s.open(prompt, GREEDY, 0, vh)
            stopping = asyncio.create_task(server.stop(5))  # drain with 5 s of grace
            await asyncio.sleep(0.1)
            await s.extend([root.greedy_token])
            scores = await s.recv()  # the open session is still served
            refused = await expect_error(addr, [open_msg(prompt, vh)])
            await s.close()
            await stopping
        await engine.close_all()
        return [root.greedy_token, scores[0].greedy_token], refused

    toks, (code, _) = run(go())
    assert toks == expected[:2] and code.name == "UNAVAILABLE"


def test_a_decided_session_decoding_alone_is_not_idle(target):
    """--idle-timeout counts messages both ways: a decided session whose edge sends nothing
    after Open while the verifier decodes (slow passes) runs to done=true."""
    model, vh, prompt, _ = target
    cfg = ServerConfig(idle_timeout_s=0.5, emulation=StepEmulation(150.0, 0.0))

    async def go():
        async with running_verifier(model, vh, cfg) as (_, addr), channel(addr) as ch:
            call = raw_call(ch)
            await call.write(pb.Uplink(open=pb.Open(
                protocol_version=PROTOCOL_VERSION, vocab_hash=vh, prompt_tokens=prompt,
                decide=pb.Decide(max_tokens=12))))  # ~12 x 150 ms: well past 0.5 s
            tokens, done = [], False
            async for msg in call:
                if msg.HasField("decided"):
                    tokens += list(msg.decided.tokens)
                    done = done or msg.decided.done
                if done:
                    break
            await call.done_writing()
            return tokens, done

    tokens, done = run(go())
    assert done and len(tokens) == 12
