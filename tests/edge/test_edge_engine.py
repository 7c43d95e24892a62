"""The edge engine end to end over real loopback sockets: real llama.cpp drafter (GGUF),
real torch target behind the gRPC verifier."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import plain_greedy

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.edge.client import channel  # noqa: E402
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig  # noqa: E402
from acespec.edge.drafting.ngram import NgramDrafter  # noqa: E402
from acespec.edge.session import EdgeEngine, EngineConfig  # noqa: E402
from acespec.edge.speculation.branches import CacheConfig  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import UNITS, ServeParams, served  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import run, running_verifier  # noqa: E402

MODES = ("ar", "sd", "pipeline", "acespec")
# Generous fixed branch budgets: tests of the hit mechanics, not of the budget policy.
WIDE = CacheConfig(guesses=4, draft_ms=200.0, uplink_bytes=1e4, downlink_bytes=1e5,
                   cloud_nodes=32, node_s=0.0)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    tok_dir, model, ggufs = tiny_pair
    tok = Tokenizer.load(tok_dir)
    return model, tok, ggufs



def drafters(model, ggufs):
    return {"llama": LlamaDrafter(ggufs["q8_0"], LlamaDrafterConfig(n_ctx=512, n_seq_max=2)),
            "ngram": NgramDrafter(model.args.vocab_size)}


async def decode(addr, vh, drafter, prompt, cfg):
    engine = EdgeEngine(lambda: channel(addr), vh, drafter)
    return await engine.generate(prompt, cfg)


def test_greedy_identical_in_every_mode_and_equal_to_plain(pair):
    model, tok, ggufs = pair
    prompt = tok.encode("def parse(text):\n    ")
    expected = plain_greedy(model, prompt, 30)

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            out = {}
            for dname, d in drafters(model, ggufs).items():
                for mode in MODES:
                    for depth in (1, 3):
                        cfg = EngineConfig(mode=mode, depth=depth, window=6, max_tokens=30)
                        toks, stats = await decode(addr, tok.vocab_hash(), d, prompt, cfg)
                        out[(dname, mode, depth)] = (toks, stats)
            return out

    for key, (toks, stats) in run(go()).items():
        assert toks == expected, key
        if key[1] != "ar":
            assert stats.rounds >= 1 and stats.passes >= 2
            assert 1 <= stats.tokens / stats.rounds


def test_sampled_reproducible_per_seed_in_every_mode(pair):
    model, tok, ggufs = pair
    prompt = tok.encode("class Node:\n")
    serve = ServeParams(SamplingParams(temperature=1.0, top_k=30), send_mass=0.4, tail_samples=1)

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            res = {}
            d = drafters(model, ggufs)["llama"]
            for mode in MODES:
                for seed in (11, 11, 12):
                    cfg = EngineConfig(mode=mode, depth=3, window=6, max_tokens=20, serve=serve,
                                       seed=seed)
                    res.setdefault(mode, []).append((await decode(addr, tok.vocab_hash(), d,
                                                                  prompt, cfg))[0])
            return res

    for mode, (a, b, c) in run(go()).items():
        assert a == b and a != c, mode


@pytest.mark.slow
def test_sampled_first_two_tokens_follow_the_target(pair):
    """600 seeds per mode, n-gram drafter (many rejections), send_mass 0.3 with 1 tail sample
    (tail draws and MoreTail happen): the first token's distribution is within TV 0.12 of
    p~ (the TV of 600 draws from p~ itself is ~0.06 here) in sd and pipeline mode, as in ar."""
    model, tok, ggufs = pair
    prompt = tok.encode("import ")
    serve = ServeParams(SamplingParams(temperature=1.0, top_k=10), send_mass=0.3, tail_samples=1)
    p = np.zeros(model.args.vocab_size)
    dist = served(model(prompt, model.new_cache(), last_only=True)[0].numpy(), serve)
    p[dist.ids] = dist.units / UNITS
    n = 600

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            d = NgramDrafter(model.args.vocab_size)
            counts, more_tail = {}, 0
            for mode in MODES:
                c = np.zeros(model.args.vocab_size)
                for seed in range(n):
                    cfg = EngineConfig(mode=mode, depth=2, window=4, max_tokens=2, serve=serve,
                                       seed=seed)
                    toks, stats = await decode(addr, tok.vocab_hash(), d, prompt, cfg)
                    c[toks[0]] += 1
                    more_tail += stats.more_tail
                counts[mode] = c / n
            return counts, more_tail

    counts, more_tail = run(go())
    for mode, freq in counts.items():
        tv = 0.5 * np.abs(freq - p).sum()
        assert tv < 0.12, (mode, tv)
    assert more_tail > 0  # the MoreTail path was exercised


def test_vocab_mismatch_is_refused_with_both_hashes(pair):
    import grpc

    model, tok, ggufs = pair

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            try:
                await decode(addr, "v1:0123456789abcdef", NgramDrafter(model.args.vocab_size),
                             tok.encode("x"), EngineConfig(mode="sd", max_tokens=4))
            except grpc.aio.AioRpcError as e:
                return e.code().name, e.details()

    code, details = run(go())
    assert code == "FAILED_PRECONDITION"
    assert "v1:0123456789abcdef" in details and tok.vocab_hash() in details


def test_unreachable_cloud_is_a_clear_error(pair):
    import socket

    model, tok, _ = pair
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    cfg = EngineConfig(mode="sd", max_tokens=4, max_reconnects=2, backoff_s=0.01)
    with pytest.raises(ConnectionError, match="unreachable after 2 reconnects"):
        run(decode(f"127.0.0.1:{port}", tok.vocab_hash(), NgramDrafter(model.args.vocab_size),
                   tok.encode("x"), cfg))


@pytest.mark.slow
def test_acespec_hits_save_rounds_and_change_nothing(pair, noisy_gguf):
    """Guessed branches are walked into only when the exactly drawn recovered token matches,
    so acespec mode gives the very same text as pipeline for a seed; each hit is a rejection
    that needed no new round (rounds = rejections - hits)."""
    model, tok, ggufs = pair
    prompt = tok.encode("def f(x):\n    return x +")
    serve = ServeParams(SamplingParams(temperature=1.0, top_k=20))

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            d = LlamaDrafter(noisy_gguf, LlamaDrafterConfig(n_ctx=512, n_seq_max=2))
            res = {}
            for mode in ("pipeline", "acespec"):
                total = [0, 0, 0, 0]
                texts = []
                for seed in range(4):
                    cfg = EngineConfig(mode=mode, depth=3, window=9, max_tokens=40, serve=serve,
                                       seed=seed, cache=WIDE)
                    out, st = await decode(addr, tok.vocab_hash(), d, prompt, cfg)
                    texts.append(out)
                    for i, v in enumerate((st.rounds, st.cache.rejections, st.cache.hits,
                                           st.cache.branches_uploaded)):
                        total[i] += v
                res[mode] = (texts, total)
            return res

    res = run(go())
    assert res["acespec"][0] == res["pipeline"][0]
    rounds, rejections, hits, uploaded = res["acespec"][1]
    print("acespec totals: rounds, rejections, hits, uploaded =", res["acespec"][1])
    assert uploaded > 0 and hits > 0
    assert rounds == rejections - hits
    assert res["pipeline"][1][2] == 0 and res["pipeline"][1][0] == res["pipeline"][1][1]


def test_acespec_greedy_hits_and_equals_ar(pair, noisy_gguf):
    """Under greedy decoding q is one-hot; the cache ranks guesses by the drafter's plain
    softmax, so branches are built, some are hit, and the text still equals ar's."""
    model, tok, _ = pair
    prompt = tok.encode("class Config:\n    def __init__(self")

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            d = LlamaDrafter(noisy_gguf, LlamaDrafterConfig(n_ctx=512, n_seq_max=2))
            out = {}
            for mode in ("ar", "pipeline", "acespec-exact"):  # the edge decides, with branches
                cfg = EngineConfig(mode=mode, depth=3, window=9, max_tokens=48, cache=WIDE)
                out[mode] = await decode(addr, tok.vocab_hash(), d, prompt, cfg)
            return out

    out = run(go())
    assert out["acespec-exact"][0] == out["pipeline"][0] == out["ar"][0]
    st = out["acespec-exact"][1]
    print("greedy acespec:", st.cache.rejections, "rejections,", st.cache.hits, "hits,",
          st.cache.branches_uploaded, "branches")
    assert st.cache.branches_uploaded > 0 and st.cache.hits > 0
    # Each hit is a rejection that started no new chain: fewer restarts than pipeline.
    assert st.rounds < out["pipeline"][1].rounds
