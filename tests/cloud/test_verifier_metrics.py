"""The figures operators watch on a verifier (acespec.cloud.serving.metrics), read from its
/metrics text after real calls of each kind over a loopback socket: time to first token,
time per output token and latency histograms, queue wait, tokens, acceptance by source,
the KV pool and the series that exist before any event."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import plain_greedy

torch = pytest.importorskip("torch")

from acespec.cloud.serving.metrics import ERROR_CODES, KINDS, SOURCES, Metrics  # noqa: E402
from acespec.cloud.serving.server import ServerConfig  # noqa: E402
from acespec.cloud.serving.servicer import VerifierServicer  # noqa: E402
from acespec.edge.client import CloudSession, generate, generate_chunks  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import channel, run, running_verifier  # noqa: E402

GREEDY = ServeParams()
SAMPLED = ServeParams(SamplingParams(temperature=0.8, top_k=20), send_mass=0.5)


def samples(text: str) -> dict[tuple, float]:
    """{(name, sorted label pairs): value} of a Prometheus text page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(page: dict, name: str, **labels: str) -> float:
    return page[(name, tuple(sorted(labels.items())))]


def scrape(engine) -> dict:
    server, port = engine.metrics.serve(0, "127.0.0.1")
    try:
        return samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=10).read().decode())
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def target(tiny_pair):
    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    return model, tok.vocab_hash(), tok.encode("import os\nimport sys\n\n")


def test_every_labelled_series_exists_before_any_call():
    page = samples(generate_latest(Metrics.create().registry).decode())
    for code in ERROR_CODES:
        assert value(page, "acespec_errors_total", code=code) == 0
    assert {"INVALID_ARGUMENT", "UNAVAILABLE", "RESOURCE_EXHAUSTED"} <= set(ERROR_CODES)
    for kind in KINDS:
        assert value(page, "acespec_requests_total", kind=kind) == 0
        assert value(page, "acespec_time_to_first_token_seconds_count", kind=kind) == 0
    for source in SOURCES:
        for fate in ("scored", "accepted"):
            assert value(page, "acespec_draft_tokens_total", source=source, fate=fate) == 0
    assert value(page, "acespec_tp_ranks") == 1
    assert ("process_start_time_seconds", ()) in page


def test_each_kind_of_call_is_timed_and_its_drafts_counted(target):
    model, vh, prompt = target
    truth = plain_greedy(model, prompt, 8)

    async def go():
        async with running_verifier(model, vh) as (engine, addr), channel(addr) as ch:
            ar = [t async for t in generate(ch, prompt, GREEDY, 0, 6, vh)]
            edge = CloudSession(ch)  # edge-decided: 3 nodes scored, 2 committed
            await edge.open(prompt, SAMPLED, 1, vh)
            await edge.extend(truth[:3])
            await edge.recv()
            await edge.commit(2)
            await edge.close()
            decided = CloudSession(ch)  # decided: the verifier walks the edge's drafts
            await decided.open_decided(prompt, GREEDY, 0, vh, max_tokens=8, stop=[])
            await decided.grow(len(prompt) + 1, truth[1:6], [-1, 0, 1, 2, 3])
            out = []
            while True:
                d = await decided.recv()
                out += d.tokens
                if d.done:
                    break
            await decided.close()
            return ar, out, d.counts, scrape(engine)

    ar, out, counts, page = run(go())
    assert ar == truth[:6] and out == truth
    for kind, tokens in (("generate", 6), ("edge_decided", 2), ("decided", 8)):
        assert value(page, "acespec_requests_total", kind=kind) == 1
        assert value(page, "acespec_prompt_tokens_total", kind=kind) == len(prompt)
        assert value(page, "acespec_generation_tokens_total", kind=kind) == tokens
        for hist in ("time_to_first_token", "time_per_output_token", "request_latency"):
            assert value(page, f"acespec_{hist}_seconds_count", kind=kind) == 1, (hist, kind)
        ttft = value(page, "acespec_time_to_first_token_seconds_sum", kind=kind)
        latency = value(page, "acespec_request_latency_seconds_sum", kind=kind)
        assert 0 < ttft < latency < 60
    # Every request to the target waited for a pass once, before its first chunk.
    assert value(page, "acespec_queue_wait_seconds_count") >= 6 + 1 + 2
    assert value(page, "acespec_sessions_waiting") == 0
    # Three prompts, short: a chunk each, and none is left to prefill.
    assert value(page, "acespec_prefill_chunks_total") == 3
    assert value(page, "acespec_sessions_prefilling") == 0
    # Decoding pass after pass, each session queued again after its pass: the device
    # waited for it between them (the turnaround), well under a second in all.
    assert 0 < value(page, "acespec_turnaround_seconds_total") < 1
    # The edge's drafts: the edge-decided session's 3 nodes and 2 commits, the decided
    # session's as its own account says; the verifier's proposals likewise.
    edge_scored = value(page, "acespec_draft_tokens_total", source="edge", fate="scored")
    edge_taken = value(page, "acespec_draft_tokens_total", source="edge", fate="accepted")
    assert edge_scored == 3 + counts["drafts_scored"]
    assert 2 <= edge_taken <= edge_scored
    assert value(page, "acespec_draft_tokens_total", source="lookup", fate="scored") == \
        counts["proposed"]
    assert value(page, "acespec_draft_tokens_total", source="lookup", fate="accepted") == \
        counts["proposed_accepted"]
    # Its one Grow, five drafts past the first decided token, reached at most 5 past the
    # verifier's decided end when applied (less by what the verifier decided meanwhile).
    assert value(page, "acespec_edge_grow_reach_count") == 1
    assert value(page, "acespec_edge_grow_reach_bucket", le="8.0") == 1
    assert value(page, "acespec_edge_grow_reach_bucket", le="-16.0") == 0
    # The KV pool: blocks back in the pool once the sessions ended, within what the
    # machine's memory can hold.
    used, allocated = value(page, "acespec_kv_blocks_used"), \
        value(page, "acespec_kv_blocks_allocated")
    capacity = value(page, "acespec_kv_blocks_capacity")
    assert 0 <= used < allocated < capacity


def test_a_call_whose_client_cancels_on_its_last_token_is_timed(target, monkeypatch):
    """An edge stops reading at its last token and cancels (as `acespec generate --mode ar`
    does), possibly while the verifier still awaits that token's write (a busy event loop
    resumes it late; here each write is held 50 ms after it is sent): each such call ended
    as asked and is timed once."""
    model, vh, prompt = target
    calls, n = 4, 3
    write = VerifierServicer._write

    async def late(self, context, msg):
        await write(self, context, msg)
        await asyncio.sleep(0.05)

    monkeypatch.setattr(VerifierServicer, "_write", late)

    async def go():
        async with running_verifier(model, vh) as (engine, addr), channel(addr) as ch:
            for seed in range(calls):
                got = []
                chunks = generate_chunks(ch, prompt, SAMPLED, seed, n, vh)
                async with contextlib.aclosing(chunks):
                    async for tokens, _ in chunks:
                        got += tokens
                        if len(got) == n:
                            break  # closing cancels the call
                assert len(got) == n
            await asyncio.sleep(0.2)  # the verifier sees the last cancel
            return scrape(engine)

    page = run(go())
    assert value(page, "acespec_requests_total", kind="generate") == calls
    assert value(page, "acespec_request_latency_seconds_count", kind="generate") == calls
    assert value(page, "acespec_generation_tokens_total", kind="generate") == calls * n


def test_kv_blocks_in_use_follow_open_sessions(target):
    model, vh, prompt = target

    async def go():
        async with running_verifier(model, vh) as (engine, addr), channel(addr) as ch:
            s = CloudSession(ch)
            await s.open(prompt * 8, SAMPLED, 1, vh)
            during = scrape(engine)
            await s.close()
            return during, scrape(engine)

    during, after = run(go())
    assert value(during, "acespec_kv_blocks_used") >= len(prompt) * 8 // 16
    assert value(after, "acespec_kv_blocks_used") < value(during, "acespec_kv_blocks_used")


def test_sessions_group_by_client_on_metrics(target, tmp_path):
    """Sessions over a real socket group by the edge id each sends (x-acespec-client), else
    by connection; with bearer tokens, by token (an edge id cannot split one token's
    sessions into more clients). The series go with a client's last session."""
    model, vh, prompt = target

    def clients(page: dict) -> dict[str, float]:
        return {dict(labels)["client"]: v for (name, labels), v in page.items()
                if name == "acespec_client_sessions"}

    async def go(cfg=None, token=None):
        async with running_verifier(model, vh, cfg) as (engine, addr), channel(addr) as ch:
            sessions = [CloudSession(ch, token, client=edge)
                        for edge in ("laptop", "laptop", "desk", None)]
            for s in sessions:
                await s.open(prompt, SAMPLED, 1, vh)
            during = scrape(engine)
            for s in sessions:
                await s.close()
            await asyncio.sleep(0.2)  # the verifier sees each close
            return during, scrape(engine)

    during, after = run(go())
    seen = clients(during)
    assert seen.pop("edge:laptop") == 2 and seen.pop("edge:desk") == 1
    assert list(seen.values()) == [1] and next(iter(seen)).startswith("peer:")
    assert clients(after) == {}
    keyed = ServerConfig(auth_tokens=frozenset({"t0ken"}))
    during, _ = run(go(keyed, "t0ken"))
    assert list(clients(during).values()) == [4]
    assert next(iter(clients(during))).startswith("key:")
    assert "t0ken" not in str(during)
