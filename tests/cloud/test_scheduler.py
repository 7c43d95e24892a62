"""The verifier's scheduler (docs/design.md §3): each session's earned share of a pass,
each client's part of it, chunked prefill and prompt scoring, and what neither may change: the logits a request gets."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from dataclasses import fields, replace

import pytest
from prometheus_client import generate_latest

torch = pytest.importorskip("torch")

from acespec.cloud.errors import Unavailable  # noqa: E402
from acespec.cloud.serving.metrics import Metrics  # noqa: E402
from acespec.cloud.target.model import Request  # noqa: E402
from acespec.cloud.verify.batcher import (  # noqa: E402
    PREFILL_ALONE_S,
    PREFILL_MIN,
    PREFILL_SLACK,
    Batcher,
    Job,
    StepEmulation,
    Windows,
)  # noqa: E402
from acespec.cloud.verify.clients import fair_level, in_turn  # noqa: E402
from acespec.cloud.verify.decided import ROOT, DecidedSession, DecideLimits  # noqa: E402
from acespec.cloud.verify.share import FLOOR, Share  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402

from verifier_harness import run  # noqa: E402

TOL = 1e-4  # float32 logits of one request scored in chunks against scored whole


# -- the share ---------------------------------------------------------------------------

def test_a_new_session_starts_with_half_the_cap():
    assert Share(cap=64).nodes() == FLOOR + 31


def test_a_session_whose_drafts_are_never_taken_gets_the_floor():
    share = Share(cap=256)
    for _ in range(40):  # the prior's accepted tokens decay away
        share.settle(scored=share.nodes(), accepted=0)
    assert share.nodes() == FLOOR and share.grant() == 1 + FLOOR
    assert share.wasted == share.total_scored > 0


def test_the_share_follows_acceptance_and_never_passes_a_better_peer():
    rng = random.Random(0)
    shares = {rate: Share(cap=64) for rate in (0.0, 0.1, 0.4, 0.8)}
    for _ in range(50):
        for rate, share in shares.items():
            n = share.nodes()
            share.settle(n, sum(rng.random() < rate for _ in range(n)))
    nodes = [shares[r].nodes() for r in sorted(shares)]
    assert nodes == sorted(nodes) and nodes[0] == FLOOR and nodes[-1] > 32


def test_a_tree_sessions_commits_count_as_accepted():
    share = Share(cap=32)
    share.settle(8)
    share.accept(3)
    assert share.total_accepted == 3 and share.wasted == 5


def test_a_decided_pass_keeps_within_its_budget():
    s = DecidedSession([1, 2, 3], ServeParams(), 0, DecideLimits(max_tokens=50, vocab=100))
    s.apply_grow(3, [ROOT] + list(range(19)), list(range(10, 30)))
    assert len(s.plan_pass(lookup_proposals=False, budget=4)) == 1 + 4
    assert len(s.plan_pass(lookup_proposals=False)) == 1 + 20


# -- the batcher, on the real tiny target --------------------------------------------------

def _batcher(model, slope_ms: float = 0.5) -> Batcher:
    """A batcher whose pass-cost line is known (base 40 ms + slope per node), as a busy
    verifier's would be, so its prefill budget is. stats: every pass's PassStats."""
    b = Batcher(model, max_batch_nodes=1024)
    for n in (1, 4, 16, 64, 128, 256, 512, 1024):
        b.cost.observe(n, 0.040 + slope_ms / 1000 * n)
    b.stats = []
    b.on_pass = b.stats.append
    b.cost.observe = lambda *_: None  # keep the line: real passes here take microseconds
    return b


def test_prefill_budget_follows_the_measured_pass_cost(tiny_pair):
    _, model, _ = tiny_pair
    b = _batcher(model)
    beside = int(PREFILL_SLACK * (0.040 + 0.0005 * 10) / 0.0005)
    assert b._prefill_budget([], decode_nodes=10) == beside  # another session decodes
    alone = (PREFILL_ALONE_S - 0.040) / 0.0005  # nothing else queued nor decoding lately
    assert abs(b._prefill_budget([], decode_nodes=0) - alone) <= 1
    flat = Batcher(model)
    for n in (1, 16, 256, 1024):
        for _ in range(3):
            flat.cost.observe(n, 0.025)  # a GPU below its knee: a prompt costs nothing extra
    assert flat._prefill_budget([], decode_nodes=10) == flat.max_batch_nodes
    assert beside >= PREFILL_MIN


def test_a_dilated_testbed_stretches_the_schedulers_windows(tiny_pair):
    """cloud serve --emulate-dilate K (bench load --dilate K): each wall-clock window of the
    scheduler is K times as long, so a prefill pass alone gets K times the seconds, and a
    client in a pass 2 s ago is still recent (its window is 4 s, not 1 s)."""
    _, model, _ = tiny_pair
    plain, dilated = Windows(), Windows().dilated(4)
    assert [getattr(dilated, f.name) for f in fields(Windows)] == \
        [4 * getattr(plain, f.name) for f in fields(Windows)]
    assert StepEmulation.parse("40,0.5", 4).dilate == 4
    with pytest.raises(ValueError, match="--emulate-dilate"):
        StepEmulation.parse("40,0.5", 0.5)
    b = Batcher(model, max_batch_nodes=4096, emulation=StepEmulation.parse("", 4))
    assert b.windows == dilated
    for n in (1, 4, 16, 64, 128, 256, 512, 1024):
        b.cost.observe(n, 0.040 + 0.0005 * n)
    alone = (4 * PREFILL_ALONE_S - 0.040) / 0.0005  # x4 the seconds of a pass alone
    assert abs(b._prefill_budget([], decode_nodes=0) - alone) <= 1
    plain_b = _batcher(model)
    for batcher in (b, plain_b):
        batcher._on_clients({"a": 8, "b": 4}, time.perf_counter() - 2.0)
    assert b._fair_level([], time.perf_counter()) == 4  # both still busy: the level is b's
    assert plain_b._fair_level([], time.perf_counter()) == math.inf  # neither is


def test_new_clients_prompts_go_whole_beside_decoding_ones(tiny_pair):
    """Beside decoding clients, a pass takes the prompts of new clients (waiting for their
    first token) whole, shortest first, within 1 + r of its cost, r the new clients per
    decoding one, and within PREFILL_ALONE_S: a burst of new clients is not fed a few
    prompt tokens a pass. A prompt that does not fit goes in chunks within PREFILL_SLACK,
    as does a prompt of a client already decoding or lately in a pass, and a prompt scored
    for its logprobs."""
    _, model, _ = tiny_pair
    b = _batcher(model)

    def decode(client: str) -> Job:
        return Job(Request([1], model.new_cache(), None), None, None, client)

    def prompt(client: str, n: int) -> Job:
        return Job(Request([1] * n, model.new_cache(), None, last_only=True), None, None,
                   client)

    def within(slack: float) -> int:  # beside one decode node: cost 40 ms + 0.5 ms a node
        return int(slack * (0.040 + 0.0005) / 0.0005)

    floor, alone = within(PREFILL_SLACK), (PREFILL_ALONE_S - 0.040) / 0.0005 - 1
    burst = [decode("d"), prompt("c", 60), prompt("a", 30), prompt("b", 40), prompt("e", 300)]
    assert within(4) == 324  # 4 new clients to 1: 30 + 40 + 60 whole, not 300 more
    assert b._prefill_budget(burst, decode_nodes=1) == 130
    crowd = [decode("d")] + [prompt(f"n{i}", 45) for i in range(10)]  # 10 to 1: 9 of 45 in
    assert b._prefill_budget(crowd, decode_nodes=1) == 405 and 405 <= alone < 450
    assert b._prefill_budget([decode("d"), prompt("a", 500)], decode_nodes=1) == floor
    three = [decode(c) for c in "def"]  # 1 new client to 3: within 27
    assert b._prefill_budget(three + [prompt("a", 24)], decode_nodes=1) == 24
    assert b._prefill_budget(three + [prompt("a", 30)], decode_nodes=1) == floor
    assert b._prefill_budget([decode("d"), prompt("d", 30)], decode_nodes=1) == floor
    scoring = Job(Request([1] * 30, model.new_cache(), None), None, None, "a",
                  reduce=lambda rows, at: [])
    assert b._prefill_budget([decode("d"), scoring], decode_nodes=1) == floor
    cache = model.new_cache()
    run(b.score(Request([5] * 20, cache, None, last_only=True), client="b"))  # b was in a
    b.forget(cache)  # pass a moment ago (its session closed since, or its prompt under way)
    assert b._prefill_budget([decode("d"), prompt("b", 30)], decode_nodes=1) == floor
    assert floor < 24


def test_a_long_prompt_is_prefilled_in_chunks_beside_a_decoding_session(tiny_pair):
    """A 700-token prompt arrives while another session decodes one token a pass: it goes in
    chunks within the prefill budget, the decoding session is in every pass, and the
    prompt's last logits equal a whole prefill's. Until its last chunk its sequence counts
    as prefilling, and each pass counts its chunk apart from the decoding request."""
    _, model, _ = tiny_pair
    rng = random.Random(1)
    prompt = [rng.randrange(model.args.vocab_size) for _ in range(700)]
    decoding = model.new_cache()

    async def go():
        b = _batcher(model)
        await b.score(Request([1, 2, 3], decoding, None, last_only=True))
        b.stats.clear()
        stop = asyncio.Event()

        async def decode():
            while not stop.is_set():
                prefilling.append(b.prefilling)
                await b.score(Request([5], decoding))

        task = asyncio.create_task(decode())
        await asyncio.sleep(0)
        logits = await b.score(Request(prompt, model.new_cache(), None, last_only=True))
        stop.set()
        await task
        after = b.prefilling
        await b.close()
        return logits, b.stats, after

    prefilling: list[int] = []
    logits, stats, after = run(go())
    whole = model(prompt, model.new_cache(), last_only=True)
    assert torch.allclose(logits, whole, atol=TOL)
    budget = int(PREFILL_SLACK * (0.040 + 0.0005) / 0.0005)
    chunks = [s.prefill for s in stats if s.prefill]
    assert sum(chunks) == len(prompt) and len(chunks) >= len(prompt) // budget
    assert max(chunks) <= budget
    assert all(s.nodes > s.prefill for s in stats if s.prefill)  # the decode went along
    assert [(s.sessions, s.prefills) for s in stats if s.prefill] == [(2, 1)] * len(chunks)
    assert max(prefilling) == 1 and after == 0


def test_a_prompt_alone_goes_in_large_chunks(tiny_pair):
    _, model, _ = tiny_pair
    prompt = list(range(1, 301))

    async def go():
        b = _batcher(model)
        await b.score(Request(prompt, model.new_cache(), None, last_only=True))
        await b.close()
        return b.stats

    stats = run(go())
    assert len(stats) == 1  # 300 tokens fit in PREFILL_ALONE_S at 40 ms + 0.5 ms/node


def test_a_prompt_does_not_yield_to_a_finished_session(tiny_pair):
    """A session that decoded a moment ago counts as decoding (a prompt beside it goes in
    chunks) until it is done or closed: forgotten, it no longer slows the next prompt."""
    _, model, _ = tiny_pair
    prompt = list(range(1, 301))
    finished = model.new_cache()

    async def go(forget: bool):
        b = _batcher(model)
        await b.score(Request([1, 2, 3], finished, None, last_only=True))
        await b.score(Request([5], finished))  # it decoded just now
        if forget:
            b.forget(finished)
        b.stats.clear()
        await b.score(Request(prompt, model.new_cache(), None, last_only=True))
        await b.close()
        return [s.prefill for s in b.stats]

    assert len(run(go(forget=False))) > 1  # beside a recent decode: chunked
    assert run(go(forget=True)) == [len(prompt)]  # alone: one pass


def test_a_busy_verifier_puts_every_session_in_every_pass(tiny_pair):
    """24 sessions decoding pass after pass, the i-th coming back i x 1.5 ms after its
    result (a busy verifier's sessions wait their turn for the event loop and their
    writes): the last 35 ms after the pass, well past GATHER_S. The pass after waits for
    them (up to half a pass of 80 ms), so they do not split into cohorts that take every
    other pass: nearly every pass holds every session."""
    _, model, _ = tiny_pair
    n, passes = 24, 12

    async def session(b, cache, turnaround_s):
        await b.score(Request([1, 2, 3], cache, None, last_only=True))
        for _ in range(passes):
            await b.score(Request([5], cache))
            await asyncio.sleep(turnaround_s)

    async def go():
        b = Batcher(model, emulation=StepEmulation(80.0))
        stats = []
        b.on_pass = stats.append
        await asyncio.gather(*(session(b, model.new_cache(), i * 0.0015) for i in range(n)))
        await b.close()
        return stats

    stats = run(go())
    decode = [s.sessions for s in stats if not s.prefill]
    assert sum(decode) == n * passes
    assert sum(decode) / len(decode) >= 0.9 * n, decode
    # The device's wait for them, counted before each pass: the last session's 34.5 ms
    # turnaround (a little more: the sessions' own work), not a pass's 80.
    turns = [s.turnaround for s in stats if s.turnaround > 0]
    assert len(turns) >= passes - 1, turns
    assert 0.034 <= statistics.median(turns) < 0.070, turns


def test_a_pass_does_not_wait_for_a_session_that_is_done(tiny_pair):
    """After a pass the next one waits for the sessions that come straight back, but not
    for one forgotten meanwhile (done): with a 2 s gather window, the session that goes on
    gets its next passes at once."""
    _, model, _ = tiny_pair

    async def go(forget: bool) -> float:
        b = Batcher(model)
        b.windows = replace(b.windows, gather_s=2.0)
        done, going = model.new_cache(), model.new_cache()

        async def finishing():
            await b.score(Request([1, 2, 3], done, None, last_only=True))
            for _ in range(3):
                await b.score(Request([5], done))
            if forget:
                b.forget(done)  # as the engine does when the session is done

        async def going_on() -> float:
            await b.score(Request([1, 2, 3], going, None, last_only=True))
            for _ in range(3):
                await b.score(Request([5], going))
            t0 = time.perf_counter()
            for _ in range(3):
                await b.score(Request([5], going))
            return time.perf_counter() - t0

        _, after = await asyncio.gather(finishing(), going_on())
        await b.close()
        return after

    assert run(go(forget=False)) > 1.5  # not forgotten: the window is waited out once
    assert run(go(forget=True)) < 1.0


def test_a_tree_request_scored_by_its_grant_equals_it_scored_whole(tiny_pair):
    """A 60-node tree under a 4-node grant: 15 passes, each with at most 4 of its nodes, and
    the same logits as one pass (parents are slots, so later chunks see earlier ones)."""
    _, model, _ = tiny_pair
    rng = random.Random(2)
    prompt = [rng.randrange(model.args.vocab_size) for _ in range(20)]
    tokens = [rng.randrange(model.args.vocab_size) for _ in range(60)]
    parents = [19] + [20 + rng.randrange(i) if rng.random() < 0.8 else 19
                      for i in range(1, 60)]

    async def go():
        b = _batcher(model)
        cache = model.new_cache()
        await b.score(Request(prompt, cache, None, last_only=True))
        b.stats.clear()
        logits = await b.score(Request(tokens, cache, parents), grant=lambda: 4)
        await b.close()
        return logits, b.stats

    logits, stats = run(go())
    ref_cache = model.new_cache()
    model(prompt, ref_cache, last_only=True)
    whole = model(tokens, ref_cache, parents)
    assert logits.shape == whole.shape and torch.allclose(logits, whole, atol=TOL)
    assert len(stats) == 15 and max(s.nodes for s in stats) == 4


def test_a_waster_waits_its_turn_and_an_honest_request_does_not(tiny_pair):
    """A 256-node request under a 2-node grant and a 3-node request without one: the small
    one is done in the first pass, whose size is 2 + 3, and no pass holds more than 2 of the
    big one's nodes."""
    _, model, _ = tiny_pair

    async def go():
        b = _batcher(model)
        big, small = model.new_cache(), model.new_cache()
        await b.score(Request([1, 2], big, None, last_only=True))
        await b.score(Request([3, 4], small, None, last_only=True))
        b.stats.clear()
        waste = asyncio.create_task(b.score(Request(list(range(5, 261)), big), lambda: 2))
        await asyncio.sleep(0)
        honest = await b.score(Request([7, 8, 9], small))
        first = list(b.stats)
        await waste
        await b.close()
        return honest, first, b.stats

    honest, first, stats = run(go())
    assert honest.shape[0] == 3
    assert [s.nodes for s in first] == [5]
    assert len(stats) == 128 and all(s.nodes <= 5 for s in stats)


def test_a_failed_chunk_takes_back_every_chunk_of_its_request(tiny_pair):
    """A request whose later chunk fails leaves the sequence's KV as before the request."""
    _, model, _ = tiny_pair

    async def go():
        b = _batcher(model)
        cache = model.new_cache()
        await b.score(Request([1, 2, 3], cache, None, last_only=True))
        before = cache.length
        bad = list(range(1, 9)) + [model.args.vocab_size + 5]  # the last chunk's id is bad
        with pytest.raises((IndexError, RuntimeError)):
            await b.score(Request(bad, cache), grant=lambda: 3)
        after = cache.length
        ok = await b.score(Request([4], cache))
        await b.close()
        return before, after, ok

    before, after, ok = run(go())
    assert after == before and ok.shape[0] == 1


def test_a_shutdown_fails_the_running_pass_without_touching_its_caches(tiny_pair):
    """fail_pending while a pass runs (the verifier's drain ending): every request fails
    with the error at once, but the KV of the requests in that pass stays the worker's
    (it is planning and writing them) until the pass ends; then each is as before."""
    _, model, _ = tiny_pair

    async def go():
        b = Batcher(model, emulation=StepEmulation(300.0))  # a pass lasts 0.3 s
        caches = [model.new_cache() for _ in range(3)]
        for c in caches:
            c.plan(None, 4)  # a prompt's slots, as if prefilled
        tasks = [asyncio.create_task(b.score(Request([5, 6], c))) for c in caches]
        await asyncio.sleep(0.01)
        while b.waiting:  # until the pass holding all three has started
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # well inside it
        b.fail_pending(Unavailable("going away"))
        during = [c.length for c in caches]
        errors = await asyncio.gather(*tasks, return_exceptions=True)
        while b.passes == 0:  # the pass ends
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        after = [c.length for c in caches]
        with pytest.raises(Unavailable):
            await b.score(Request([7], caches[0]))
        await b.close()
        return during, errors, after

    during, errors, after = run(go())
    assert all(isinstance(e, Unavailable) for e in errors), errors
    assert during == [6, 6, 6], "the running pass's caches were truncated under it"
    assert after == [4, 4, 4]


def test_share_metrics_are_per_client_and_go_with_its_last_session():
    m = Metrics.create()
    share, other = Share(cap=16), Share(cap=16)
    share.settle(10, 2)
    m.on_share("ab" * 16, share)
    rows = [("edge:laptop", [share, other], 7.5)]
    m.clients.rows = lambda: rows  # read at each scrape, as Engine.client_rows
    text = generate_latest(m.registry).decode()
    assert f'acespec_client_share{{client="edge:laptop"}} ' \
        f'{float(share.nodes() + other.nodes())}' in text
    assert 'acespec_client_sessions{client="edge:laptop"} 2.0' in text
    assert 'acespec_client_nodes{client="edge:laptop"} 7.5' in text
    assert 'acespec_speculative_nodes_total{fate="wasted"} 8.0' in text
    assert "session=" not in text  # no per-session series
    m.drop_share("ab" * 16)
    rows.clear()  # the client's last session closed
    assert 'client="edge:laptop"' not in generate_latest(m.registry).decode()


# -- a share per client ------------------------------------------------------------------

def test_the_fair_level_is_what_the_next_busiest_client_could_use():
    assert fair_level({"a": 300}) == math.inf  # alone: unlimited
    assert fair_level({"many": 300, "one": 5}) == 5
    assert fair_level({"many": 300, "one": 5, "two": 40}) == 40
    assert fair_level({"many": 300, "one": 5}, free=64) == 59  # the knee's free room
    assert fair_level({"a": 8, "b": 8}, free=64) == 56  # below the knee nobody waits


def test_prompts_go_in_turn_by_client_and_shortest_first():
    jobs = [("many", 5), ("many", 6), ("many", 7), ("one", 300), ("other", 40)]
    order = in_turn(jobs, lambda j: j[0], lambda j: j[1])
    assert order == [("many", 5), ("other", 40), ("one", 300), ("many", 6), ("many", 7)]
    alone = [("a", 30), ("b", 10), ("c", 20)]
    assert in_turn(alone, lambda j: j[0], lambda j: j[1]) == sorted(alone, key=lambda j: j[1])


def test_a_client_buys_no_share_with_sessions(tiny_pair):
    """One client's 24 sessions (one node a pass each) beside another client's one session
    of 4 nodes a pass, on a device with no free room: the many-session client has at most
    4 nodes in any pass, the other is in every pass, and every one of the 24 sessions is
    served in turn (none starves)."""
    _, model, _ = tiny_pair
    rounds = 6

    async def go():
        b = _batcher(model)
        b.cost.hinge = lambda: (0.040, 0.0005, 0)  # linear from the first node: no knee
        caches = [model.new_cache() for _ in range(25)]
        for i, c in enumerate(caches):
            await b.score(Request([1, 2, 3], c, None, last_only=True),
                          client="many" if i else "one")
        b.stats.clear()
        served = [0] * 25

        async def one_session(i):
            for _ in range(rounds):
                if i == 0:
                    await b.score(Request([5, 6, 7, 8], caches[0]), client="one")
                else:
                    await b.score(Request([5], caches[i]), client="many")
                served[i] += 1

        await asyncio.gather(*(one_session(i) for i in range(25)))
        await b.close()
        return b.stats, served

    stats, served = run(go())
    assert served == [rounds] * 25
    while_both = [s for s in stats if len(s.clients) == 2]
    assert len(while_both) >= rounds - 1
    assert all(s.clients["many"] <= 4 for s in while_both), [s.clients for s in while_both]
    assert all(s.clients["many"] <= 4 or "one" not in s.clients for s in stats)


def test_alone_a_client_is_not_limited(tiny_pair):
    _, model, _ = tiny_pair

    async def go():
        b = _batcher(model)
        caches = [model.new_cache() for _ in range(12)]
        for c in caches:
            await b.score(Request([1, 2, 3], c, None, last_only=True), client="many")
        b.stats.clear()
        await asyncio.gather(*(b.score(Request([5], c), client="many") for c in caches))
        await b.close()
        return b.stats

    assert [s.clients for s in run(go())] == [{"many": 12}]


# -- scoring a prompt ----------------------------------------------------------------------

def test_a_scored_prompt_goes_in_chunks_and_keeps_only_what_it_reduces(tiny_pair):
    """A 500-token prompt scored for its logprobs beside a decoding session: in chunks of the
    prefill budget (the decode in every pass), each chunk reduced as it comes (never the
    whole [500, V] logits), the rows equal to one whole pass's."""
    _, model, _ = tiny_pair
    rng = random.Random(3)
    prompt = [rng.randrange(model.args.vocab_size) for _ in range(500)]
    decoding = model.new_cache()
    seen = []

    def reduce(rows, at):
        seen.append((at, rows.shape[0]))
        return [rows[j].argmax().item() for j in range(rows.shape[0])]

    async def go():
        b = _batcher(model)
        await b.score(Request([1, 2, 3], decoding, None, last_only=True), client="d")
        b.stats.clear()
        stop = asyncio.Event()

        async def decode():
            while not stop.is_set():
                await b.score(Request([5], decoding), client="d")

        task = asyncio.create_task(decode())
        await asyncio.sleep(0)
        out = await b.score(Request(prompt, model.new_cache(), None), client="s",
                            reduce=reduce)
        stop.set()
        await task
        await b.close()
        return out, b.stats

    out, stats = run(go())
    whole = model(prompt, model.new_cache())
    assert out == whole.argmax(-1).tolist()
    budget = int(PREFILL_SLACK * (0.040 + 0.0005) / 0.0005)  # scoring waits for no token
    assert len(seen) >= len(prompt) // budget and max(n for _, n in seen) <= budget
    assert [at for at, _ in seen] == sorted(at for at, _ in seen) and seen[0][0] == 0
    assert all("d" in s.clients for s in stats if s.prefill)
