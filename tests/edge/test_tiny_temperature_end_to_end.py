"""Temperature 5e-324 (the smallest positive float64, inside the accepted [0, 2]) through a
real verifier over loopback gRPC and the real llama.cpp drafter: cloud-only Generate and the
edge engine, exact and coupled, decode the greedy text (docs/design.md §5)."""

from __future__ import annotations

import pytest

from conftest import plain_greedy

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.edge.client import channel, generate  # noqa: E402
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig  # noqa: E402
from acespec.edge.session import EdgeEngine, EngineConfig  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import run, running_verifier  # noqa: E402

pytestmark = pytest.mark.slow
TINY_T = 5e-324
N = 12


@pytest.mark.parametrize("coupled", [False, True], ids=["exact", "coupled"])
def test_smallest_temperature_decodes_the_greedy_text(tiny_pair, coupled):
    tok_dir, model, ggufs = tiny_pair
    tok = Tokenizer.load(tok_dir)
    vh, prompt = tok.vocab_hash(), tok.encode("def parse(text):\n    ")
    serve = ServeParams(SamplingParams(TINY_T, top_k=20, coupled=coupled))
    drafter = LlamaDrafter(ggufs["q8_0"], LlamaDrafterConfig(n_ctx=512, n_seq_max=2))

    async def go():
        out = {}
        async with running_verifier(model, vh) as (_, addr):
            async with channel(addr) as ch:
                out["cloud"] = [t async for t in generate(ch, prompt, serve, 3, N, vh)]
            engine = EdgeEngine(lambda: channel(addr), vh, drafter)
            for mode in ("sd", "pipeline", "acespec"):
                cfg = EngineConfig(mode=mode, depth=3, window=6, max_tokens=N, serve=serve,
                                   seed=3)
                out[mode] = (await engine.generate(prompt, cfg))[0]
        return out

    try:
        got = run(go())
    finally:
        drafter.close()
    expected = plain_greedy(model, prompt, N)
    for key, toks in got.items():
        assert toks == expected, key
