"""Sessions the verifier decides, end to end over loopback gRPC: the real llama.cpp drafter
(and the n-gram drafter), the real torch target. For a seed, greedy and coupled sampling give
cloud-only decoding's tokens in every mode; an edge that meets an older verifier falls back
to the tree protocol (or refuses coupled sampling clearly)."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from acespec.cloud.serving.metrics import Metrics  # noqa: E402
from acespec.cloud.serving.server import ServerConfig, create_server  # noqa: E402
from acespec.cloud.serving.servicer import VerifierServicer  # noqa: E402
from acespec.cloud.verify.engine import Engine  # noqa: E402
from acespec.edge.client import VerifierTooOld, channel  # noqa: E402
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig  # noqa: E402
from acespec.edge.drafting.ngram import NgramDrafter  # noqa: E402
from acespec.edge.session import EdgeEngine, EngineConfig  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import run, running_verifier  # noqa: E402

MODES = ("ar", "sd", "pipeline", "acespec")
SAMPLINGS = {"greedy": SamplingParams(),
             "coupled": SamplingParams(temperature=0.8, top_k=40, coupled=True)}


@pytest.fixture(scope="module")
def setup(tiny_pair, noisy_gguf):
    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    drafters = {"llama": LlamaDrafter(noisy_gguf, LlamaDrafterConfig(n_ctx=512, n_seq_max=2)),
                "ngram": NgramDrafter(model.args.vocab_size)}
    return model, tok, drafters


def cfg(mode: str, sampling: SamplingParams, seed: int = 11, **kw) -> EngineConfig:
    return EngineConfig(mode=mode, depth=3, window=8, max_tokens=40, seed=seed,
                        serve=ServeParams(sampling), **kw)


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
def test_same_seed_same_tokens_in_every_mode_and_drafter(setup, sampling):
    model, tok, drafters = setup
    prompt = tok.encode("def handler(event):\n    ")
    params = SAMPLINGS[sampling]

    async def go():
        async with running_verifier(model, tok.vocab_hash()) as (_, addr):
            out, stats = {}, {}
            for dname, drafter in drafters.items():
                engine = EdgeEngine(lambda: channel(addr), tok.vocab_hash(), drafter)
                for mode in MODES:
                    toks, st = await engine.generate(prompt, cfg(mode, params))
                    out[(dname, mode)], stats[(dname, mode)] = toks, st
            return out, stats

    out, stats = run(go())
    ar = out[("llama", "ar")]
    assert len(ar) == 40
    assert all(toks == ar for toks in out.values()), {k: v[:8] for k, v in out.items()}
    for dname in ("llama", "ngram"):  # acespec here is decided by the verifier
        figures = stats[(dname, "acespec")].as_dict()
        assert figures["verifier_busy"] is not None and 0 < figures["verifier_busy"] <= 1
        assert figures["continuation_tokens"] >= 1
        assert figures["passes"] >= 1 and figures["tokens"] == 40
        assert "target_forwards" not in figures
    other_seed = run(_ar(model, tok, prompt, replace(cfg("ar", params), seed=12)))
    if sampling == "coupled":  # the seed matters (and the equality above is not trivial)
        assert other_seed != ar


async def _ar(model, tok, prompt, c):
    async with running_verifier(model, tok.vocab_hash()) as (_, addr):
        return (await EdgeEngine(lambda: channel(addr), tok.vocab_hash()).generate(prompt, c))[0]


class OldVerifier(VerifierServicer):
    """A verifier from before decided sessions and coupled sampling: it never sees the
    fields it does not know (protobuf drops unknown fields for it)."""

    async def _read(self, context):
        msg = await super()._read(context)
        if hasattr(msg, "WhichOneof") and msg.WhichOneof("msg") == "open":
            msg.open.ClearField("decide")
            msg.open.sampling.coupled = False
        return msg


@contextlib.asynccontextmanager
async def old_verifier(model, vh):
    import acespec.cloud.serving.server as server_mod

    real = server_mod.VerifierServicer
    server_mod.VerifierServicer = OldVerifier
    try:
        cfg = replace(ServerConfig(), host="127.0.0.1", port=0)
        engine = Engine(model, vh, "old-model", cfg.limits, cfg.emulation, Metrics.create())
        server, port = await create_server(engine, cfg)
    finally:
        server_mod.VerifierServicer = real
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
        await engine.close_all()


def test_new_edge_against_an_old_verifier(setup):
    """Greedy acespec falls back to the tree protocol on the same stream (same tokens);
    coupled sampling is refused clearly rather than served wrongly."""
    model, tok, drafters = setup
    prompt = tok.encode("import os\n")

    async def go():
        async with old_verifier(model, tok.vocab_hash()) as addr:
            engine = EdgeEngine(lambda: channel(addr), tok.vocab_hash(), drafters["llama"])
            toks, st = await engine.generate(prompt, cfg("acespec", SAMPLINGS["greedy"]))
            with pytest.raises(VerifierTooOld, match="coupled"):
                await engine.generate(prompt, cfg("acespec", SAMPLINGS["coupled"]))
            return toks, st

    toks, st = run(go())
    assert toks == run(_ar(model, tok, prompt, cfg("ar", SAMPLINGS["greedy"])))
    assert st.verifier is None  # the tree protocol ran: no verifier account
