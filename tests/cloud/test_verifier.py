"""The verifier over a real loopback socket with the real torch target (tiny pair)."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import plain_greedy

torch = pytest.importorskip("torch")

from acespec.cloud.serving.server import ServerConfig  # noqa: E402
from acespec.cloud.serving.servicer import VerifierServicer  # noqa: E402
from acespec.cloud.verify.batcher import StepEmulation  # noqa: E402
from acespec.edge.client import CloudSession, generate  # noqa: E402
from acespec.proto import PROTOCOL_VERSION  # noqa: E402
from acespec.proto import acespec_pb2 as pb  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams, n_sent, node_score, served, tail_draws  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import channel, run, running_verifier  # noqa: E402

GREEDY = ServeParams()
SAMPLED = ServeParams(SamplingParams(temperature=0.8, top_k=20), send_mass=0.5)


@pytest.fixture(scope="module")
def target(tiny_pair):
    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    return model, tok.vocab_hash(), tok.encode("import os\nimport sys\n\n")



def test_greedy_generate_equals_plain_decoding(target):
    model, vh, prompt = target

    async def go():
        async with running_verifier(model, vh) as (_, addr), channel(addr) as ch:
            return [t async for t in generate(ch, prompt, GREEDY, 0, 20, vh)]

    assert run(go()) == plain_greedy(model, prompt, 20)


def test_cloud_only_decoding_marks_the_token_that_ends_it(target):
    """The engine says which token is its last: the max_tokens-th, or a stop token, or the
    default count's last where max_tokens is unset (0)."""
    from acespec.cloud.verify.engine import DEFAULT_GENERATE_TOKENS, Engine

    model, vh, prompt = target
    greedy = plain_greedy(model, prompt, 6)

    async def go():
        engine = Engine(model, vh, "last")
        try:
            calls = {}
            for name, max_tokens, stop in (("count", 5, ()), ("stop", 0, (greedy[2],)),
                                           ("unset", 0, ())):
                calls[name] = [g async for g in engine.generate(prompt, GREEDY, 0, max_tokens,
                                                                stop)]
            return calls
        finally:
            await engine.close_all()

    calls = run(go())
    for name, out in calls.items():
        assert [g.last for g in out] == [False] * (len(out) - 1) + [True], name
    assert [g.token for g in calls["count"]] == greedy[:5]
    assert [g.token for g in calls["stop"]] == greedy[:3]
    assert len(calls["unset"]) == min(DEFAULT_GENERATE_TOKENS,
                                      model.args.max_position_embeddings - len(prompt))


def test_a_finished_generate_call_holds_up_no_pass(target):
    """After a pass the next one waits for the sequences that come straight back; a
    Generate call that has decided its last token is not one of them. With a 2 s gather
    window, a call that goes on after another has ended gets its passes at once (before,
    the window was waited out once for the ended call)."""
    from dataclasses import replace

    from acespec.cloud.verify.engine import Engine

    model, vh, prompt = target

    async def go() -> float:
        engine = Engine(model, vh, "gather")
        engine.batcher.windows = replace(engine.batcher.windows, gather_s=2.0)
        try:
            async def tokens(n: int) -> float:
                t0 = time.perf_counter()
                out = [g async for g in engine.generate(prompt, GREEDY, 0, n)]
                assert len(out) == n
                return time.perf_counter() - t0

            _, going_on = await asyncio.gather(tokens(2), tokens(8))
            return going_on
        finally:
            await engine.close_all()

    assert run(go()) < 1.5


def test_sampled_generate_is_seeded(target):
    model, vh, prompt = target

    async def go():
        async with running_verifier(model, vh) as (_, addr), channel(addr) as ch:
            runs = []
            for seed in (1, 1, 2):
                runs.append([t async for t in generate(ch, prompt, SAMPLED, seed, 12, vh)])
            return runs

    a, b, c = run(go())
    assert a == b and a != c


def _reference_scores(model, prompt, path, params, seed, first_id):
    """Served distributions of a chain scored on its own (no tree, no server)."""
    logits = model(list(prompt) + list(path), model.new_cache()).numpy()[len(prompt) - 1:]
    dists = [served(row, params) for row in logits]
    return dists


def test_tree_scores_equal_path_scores(target):
    model, vh, prompt = target
    # Root 0; chain 1-2-3; branch 4 off node 1; branch 5 off root; node 6 under 4.
    tokens = [10, 11, 12, 20, 30, 21]
    parents = [0, 1, 2, 1, 0, 4]

    async def go():
        async with running_verifier(model, vh) as (_, addr), channel(addr) as ch:
            s = CloudSession(ch)
            root = await s.open(prompt, SAMPLED, 7, vh)
            await s.extend(tokens, parents)
            return root, await s.recv()

    root, scores = run(go())
    paths = {1: [10], 2: [10, 11], 3: [10, 11, 12], 4: [10, 20], 5: [30], 6: [10, 20, 21]}
    for score in scores:
        path = paths[score.node_id]
        dists = _reference_scores(model, prompt, path, SAMPLED, 7, 0)
        expect = node_score(dists[-1], SAMPLED, score.node_id, dists[-2].units_of(path[-1]), 7,
                            position=len(prompt) + len(path))
        assert np.array_equal(score.ids, expect.ids) and np.array_equal(score.units, expect.units)
        assert score.self_units == expect.self_units and score.tail_units == expect.tail_units
        assert np.array_equal(score.tail_ids, expect.tail_ids)
    # The root comes from the prompt's prefill, which computes the last row only: compare it
    # with the same computation (a full-sequence pass may round a unit differently).
    last = model(list(prompt), model.new_cache(), last_only=True).numpy()[-1]
    ref_root = served(last, SAMPLED)
    assert np.array_equal(root.units, node_score(ref_root, SAMPLED, 0, 0, 7, len(prompt)).units)


def test_commit_reroots_and_keeps_scoring_below(target):
    model, vh, prompt = target

    async def go():
        async with running_verifier(model, vh) as (engine, addr), channel(addr) as ch:
            s = CloudSession(ch)
            await s.open(prompt, GREEDY, 0, vh)
            await s.extend([10, 11, 12])
            await s.recv()
            await s.extend([40], [1])  # a sibling branch under node 1
            await s.recv()
            await s.commit(2)  # path 0-1-2 final; node 3 survives, node 4 is freed
            await s.extend([13], [3])
            out = await s.recv()
            live = next(iter(engine.sessions.values())).live_nodes
            return out, live

    out, live = run(go())
    ref = plain_greedy(model, list(prompt) + [10, 11, 12, 13], 1)[0]
    assert out[0].node_id == 5 and out[0].greedy_token == ref
    assert live == 2  # nodes 3 and 5 below the new root 2


def test_batching_sessions_equals_scoring_apart(target):
    model, vh, prompt = target
    cfg = ServerConfig(emulation=StepEmulation(30))  # passes take long enough to queue up

    async def one(addr, toks, seed):
        async with channel(addr) as ch:
            s = CloudSession(ch)
            await s.open(prompt, SAMPLED, seed, vh)
            await s.extend(toks)
            return await s.recv()

    async def go():
        async with running_verifier(model, vh, cfg) as (engine, addr):
            together = await asyncio.gather(*(one(addr, [5 + i, 6, 7], i) for i in range(4)))
            passes, requests = engine.batcher.passes, engine.batcher.requests_scored
            apart = [await one(addr, [5 + i, 6, 7], i) for i in range(4)]
            return together, apart, passes, requests

    together, apart, passes, requests = run(go())
    assert passes < requests  # some pass scored several sessions' requests at once
    for a, b in zip(together, apart):
        for x, y in zip(a, b):
            assert np.array_equal(x.ids, y.ids) and np.array_equal(x.units, y.units)
            assert np.array_equal(x.tail_ids, y.tail_ids)


def test_more_tail_continues_the_stream(target):
    model, vh, prompt = target
    params = ServeParams(SamplingParams(temperature=1.5), send_mass=0.05, tail_samples=2)

    async def go():
        async with running_verifier(model, vh) as (_, addr), channel(addr) as ch:
            s = CloudSession(ch)
            root = await s.open(prompt, params, 3, vh)
            await s.more_tail(0, 3)
            return root, await s.recv()

    root, tail = run(go())
    dist = served(model(prompt, model.new_cache(), last_only=True)[0].numpy(), params)
    ids, _ = tail_draws(dist, n_sent(dist, params.send_mass), 3, len(prompt), 0, 5)
    assert root.tail_ids.tolist() == ids[:2].tolist() and tail.ids == ids[2:].tolist()


def test_health_and_metrics(target):
    model, vh, prompt = target

    async def go():
        async with running_verifier(model, vh) as (engine, addr), channel(addr) as ch:
            h = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="acespec.v1.Verifier"))
            [t async for t in generate(ch, prompt, GREEDY, 0, 3, vh)]
            server, port = engine.metrics.serve(0, "127.0.0.1")
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            server.shutdown()
            return h.status, text.decode()

    status, text = run(go())
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert "acespec_passes_total 3.0" in text
    assert "acespec_forward_passes" not in text
    assert 'acespec_message_bytes_total{direction="down"}' in text


def test_commit_riding_on_extend_equals_separate_commit(target):
    model, vh, prompt = target

    async def go(piggyback):
        async with running_verifier(model, vh) as (engine, addr), channel(addr) as ch:
            s = CloudSession(ch)
            await s.open(prompt, GREEDY, 0, vh)
            await s.extend([10, 11, 12])
            await s.recv()
            if piggyback:
                await s.extend([13], [3], commit=2)
            else:
                await s.commit(2)
                await s.extend([13], [3])
            out = await s.recv()
            return out[0].greedy_token, next(iter(engine.sessions.values())).live_nodes

    assert run(go(True)) == run(go(False))
    assert run(go(True))[1] == 2  # nodes 3 and 4 below the new root 2


def test_extends_queued_while_busy_share_one_forward_pass(target):
    model, vh, prompt = target
    cfg = ServerConfig(emulation=StepEmulation(60))
    chunks = [[10, 11], [12], [13, 14], [15]]

    async def go(back_to_back):
        async with running_verifier(model, vh, cfg) as (engine, addr), channel(addr) as ch:
            s = CloudSession(ch)
            await s.open(prompt, SAMPLED, 4, vh)
            out = []
            for c in chunks:
                await s.extend(c)
                if not back_to_back:
                    out += await s.recv()
            while back_to_back and len(out) < 6:
                out += await s.recv()
            return out, engine.batcher.passes

    pipelined, passes = run(go(True))
    apart, passes_apart = run(go(False))
    assert passes_apart == 1 + len(chunks)
    assert passes <= 3  # open, the first Extend, then the three that queued behind it
    for x, y in zip(pipelined, apart):
        assert x.node_id == y.node_id and np.array_equal(x.units, y.units)
        assert x.self_units == y.self_units and np.array_equal(x.tail_ids, y.tail_ids)


def test_a_decided_session_writes_each_pass_while_its_next_pass_runs(target, monkeypatch):
    """The verifier queues a decided session's next pass, then writes the last one's
    Decided once that pass has started: the write is not part of the idle time between
    passes. Every Decided but the first token and the last is written while a pass runs."""
    model, vh, prompt = target
    cfg = ServerConfig(emulation=StepEmulation(60))
    during: list[bool] = []
    engines = []
    write = VerifierServicer._write

    async def watched(self, context, msg):
        if msg.WhichOneof("msg") == "decided" and not msg.decided.done:
            during.append(bool(engines[0].batcher._running))
        await write(self, context, msg)

    monkeypatch.setattr(VerifierServicer, "_write", watched)

    async def go():
        async with running_verifier(model, vh, cfg) as (engine, addr), channel(addr) as ch:
            engines.append(engine)
            s = CloudSession(ch)
            await s.open_decided(prompt, GREEDY, 0, vh, max_tokens=6, stop=[])
            while not (await s.recv()).done:
                pass
            await s.close()

    run(go())
    first, passes = during[0], during[1:]
    assert not first and len(passes) >= 2 and all(passes), during


@pytest.mark.parametrize("early", [True, False])
def test_the_first_token_goes_ahead_of_opened_when_the_edge_takes_it(target, early):
    """Asked (Decide.first_before_opened), the verifier sends the first Decided alone and
    Opened just before the next one, so on a slow link the first token does not wait behind
    Opened's bytes; not asked, Opened comes first, as an edge that does not know the field
    reads it. The decided text is the same either way."""
    model, vh, prompt = target

    async def go():
        async with running_verifier(model, vh) as (_, addr), channel(addr) as ch:
            call = ch.stream_stream("/acespec.v1.Verifier/Session",
                                    request_serializer=pb.Uplink.SerializeToString,
                                    response_deserializer=pb.Downlink.FromString)()
            await call.write(pb.Uplink(open=pb.Open(
                protocol_version=PROTOCOL_VERSION, vocab_hash=vh, prompt_tokens=prompt,
                decide=pb.Decide(max_tokens=4, first_before_opened=early))))
            kinds, tokens = [], []
            async for msg in call:
                kinds.append(msg.WhichOneof("msg"))
                if msg.HasField("opened"):
                    assert msg.opened.decides and msg.opened.session_id
                if msg.HasField("decided"):
                    tokens += list(msg.decided.tokens)
                    if msg.decided.done:
                        break
            await call.done_writing()
            return kinds, tokens

    kinds, tokens = run(go())
    first = ["decided", "opened", "decided"] if early else ["opened", "decided", "decided"]
    assert kinds[:3] == first and kinds.count("opened") == 1
    assert tokens == plain_greedy(model, prompt, 4)


def test_the_edge_reads_its_first_token_before_opened(target):
    """The edge's client asks for the first token ahead of Opened: open_decided returns on
    it, the session's id arrives with the next message, and the tokens are the target's."""
    model, vh, prompt = target

    async def go():
        async with running_verifier(model, vh) as (_, addr), channel(addr) as ch:
            sess = CloudSession(ch)
            assert await sess.open_decided(prompt, GREEDY, 0, vh, 5, []) is None
            assert sess.session_id == "" and sess.next_id == 0  # Grow ids count from 0
            tokens = []
            while True:
                d = await sess.recv()
                tokens += d.tokens
                if d.done:
                    break
            await sess.done_writing()
            return tokens, sess.session_id

    tokens, session_id = run(go())
    assert tokens == plain_greedy(model, prompt, 5) and session_id
