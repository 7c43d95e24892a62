"""Structured output's work on the verifier (acespec.cloud.verify.grammar_work): a session's
grammar is built and applied in the grammar threads, never on the event loop that serves
every stream nor in the worker that runs the passes, and what it costs there is charged to
the session's share. Decided and edge-decided sessions and Generate, over the engine."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from acespec.cloud.verify.engine import Engine  # noqa: E402
from acespec.edge.api.structured import response_grammar  # noqa: E402
from acespec.shared import grammar as grammar_mod  # noqa: E402
from acespec.shared.config import SamplingParams  # noqa: E402
from acespec.shared.served import ServeParams  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from verifier_harness import run  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}


@pytest.fixture
def where(monkeypatch):
    """The names of the threads that built a grammar's matcher and masked with it."""
    seen: dict[str, set[str]] = {"build": set(), "mask": set()}
    build, mask = grammar_mod.new_matcher, grammar_mod.Cursor.mask

    def watched_build(*a, **kw):
        seen["build"].add(threading.current_thread().name)
        return build(*a, **kw)

    def watched_mask(self, text):
        seen["mask"].add(threading.current_thread().name)
        return mask(self, text)

    monkeypatch.setattr("acespec.cloud.verify.grammar_work.new_matcher", watched_build)
    monkeypatch.setattr(grammar_mod.Cursor, "mask", watched_mask)
    return seen


def test_grammars_are_built_and_applied_off_the_loop_and_the_passes(tiny_pair, where):
    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    prompt = tok.encode("def f(x):\n    return x\n")
    grammar = response_grammar(FORMAT)

    def params(temperature=0.0, coupled=False):
        return ServeParams(SamplingParams(temperature, coupled=coupled, grammar=grammar,
                                          output_from=len(prompt)))

    async def go():
        engine = Engine(model, tok.vocab_hash(), "t",
                        tokenizer=(str(tok.path), tok.eos_id))
        loop_thread = threading.current_thread().name
        sid, session, _ = await engine.open_decided(prompt, params(), 0, 24, [tok.eos_id])
        charged = []
        session.share.charge = charged.append
        for _ in range(3):
            await engine.decided_pass(session)
        engine.close(sid)
        res = await engine.open(prompt, params(0.8), 1)
        await engine.extend(res.session, 1, torch.tensor([5]).numpy(),
                            torch.tensor([0]).numpy())
        engine.close(res.session_id)
        out = [g.token async for g in engine.generate(prompt, params(), 0, 8, [tok.eos_id])]
        await engine.close_all()
        return loop_thread, charged, out

    loop_thread, charged, out = run(go())
    assert len(where["build"]) == 1 and where["mask"]  # one build: the matcher is kept
    threads = where["build"] | where["mask"]
    assert all(name.startswith("grammar") for name in threads), threads
    assert loop_thread not in threads
    assert len(charged) == 3 and all(nodes > 0 for nodes in charged)  # each pass's masks
    assert tok.decode(out).startswith("{")


def test_a_grammar_that_builds_too_long_is_refused_by_name(tiny_pair, monkeypatch):
    from acespec.cloud.errors import InvalidArgument
    from acespec.cloud.verify import grammar_work

    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    build = grammar_mod.new_matcher

    def slow_build(*a, **kw):
        import time
        time.sleep(0.5)
        return build(*a, **kw)

    monkeypatch.setattr(grammar_work, "BUILD_S", 0.1)
    monkeypatch.setattr(grammar_work, "new_matcher", slow_build)
    work = grammar_work.GrammarWork((str(tok.path), tok.eos_id), model.args.vocab_size)
    params = ServeParams(SamplingParams(grammar=response_grammar(FORMAT)))
    with pytest.raises(InvalidArgument, match=r"sampling.grammar: .* more than 0.1 s"):
        run(work.cursor(params))
    work.close()
