"""What a reader is told of an answer with unverified text (acespec.edge.shown), what the
engine's runner makes of verified tokens against its unverified span, and the terminal's
rendering of both: pure, no model, no socket."""

from __future__ import annotations

import io

from acespec.edge.session.config import EngineConfig
from acespec.edge.session.offline import Reconciled, Unverified
from acespec.edge.session.runner import Runner
from acespec.edge.shown import Append, Confirm, Replace, ShownText, SpanMirror
from acespec.edge.status import AnswerPrinter


def apply(ops, verified: str, unverified: str) -> tuple[str, str]:
    """A reader following the ops: (verified text, unverified text after it)."""
    for op in ops:
        if isinstance(op, Append) and op.verified:
            assert not unverified, "verified text appended after unverified text"
            verified += op.text
        elif isinstance(op, Append):
            unverified += op.text
        elif isinstance(op, Confirm):
            n = op.end - len(verified)
            assert 0 <= n <= len(unverified)
            verified, unverified = verified + unverified[:n], unverified[n:]
        else:
            n = op.offset - len(verified)
            assert 0 <= n <= len(unverified) and not (op.text and n)
            verified, unverified = verified + op.text, unverified[:n]
    return verified, unverified


def test_unverified_text_is_confirmed_then_replaced_from_the_first_disagreement():
    s = ShownText()
    assert s.update("def f", "") == [Append("def f")]
    assert s.update("def f", "(x):\n    return") == [Append("(x):\n    return", False)]
    assert s.update("def f(x", "):\n    return") == [Confirm(7)]
    assert s.update("def f(x):\n    pass", "") == [Confirm(14), Replace(14, "pass")]
    assert s.update("def f(x):\n    pass\n", "") == [Append("\n")]


def test_a_span_cut_back_is_dropped_and_a_confirmed_span_goes_on_verified():
    s = ShownText()
    s.update("a", "bcd")
    assert s.update("a", "b") == [Replace(2, "")]
    assert s.update("abx", "") == [Confirm(2), Append("x")]


def test_every_sequence_of_states_is_followed_exactly_by_a_reader():
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(200):
        s, verified, shown, pipe = ShownText(), "", ("", ""), io.StringIO()
        printer = AnswerPrinter(pipe)
        for _ in range(12):
            verified += "".join(rng.choice(list("ab"), rng.integers(0, 3)))
            unverified = "".join(rng.choice(list("ab"), rng.integers(0, 4)))
            ops = s.update(verified, unverified)
            shown = apply(ops, *shown)
            printer.write(ops)
            assert shown == (verified, unverified)
            assert pipe.getvalue() == verified  # a pipe is never written unverified text


def _runner(**kw) -> tuple[Runner, list, list]:
    events, tokens = [], []
    cfg = EngineConfig(mode="acespec", max_tokens=20, stop_ids=frozenset({0}), **kw)
    run = Runner(None, [5, 6], cfg, lambda ids, stats: tokens.extend(ids), 0, [1],
                 events.append)
    return run, events, tokens


def test_runner_confirms_the_span_token_by_token_then_drops_it_at_a_disagreement():
    run, events, tokens = _runner(offline="local")
    run.unverified = [7, 8, 9, 10]
    run.emit([7, 8])
    assert run.unverified == [9, 10] and events == []
    run.emit([4, 9])
    assert tokens == [7, 8, 4, 9] and run.unverified == []
    assert events == [Reconciled(confirmed=2, replaced=2)]
    assert (run.stats.unverified_confirmed, run.stats.unverified_replaced) == (2, 2)


def test_runner_settles_a_span_that_ended_in_an_end_token():
    run, events, _ = _runner(offline="local")
    run.unverified, run.local_ended = [7], True
    run.emit([7])
    assert events == []  # its end token is not verified yet
    run.emit([0])
    assert run.finished and events == [Reconciled(confirmed=1, replaced=0)]


def test_span_mirror_follows_the_runner():
    m = SpanMirror()
    m.event(Unverified((7, 8), (7, 8, 9)))
    m.verified([7])
    assert m.span == (8, 9)
    m.verified([3])
    assert m.span == ()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_only_verified_text_and_a_terminal_rewrites_the_dim_span():
    ops = [Append("x = "), Append("1 + 1", False), Confirm(6), Replace(6, "+ 2")]
    pipe, tty = io.StringIO(), _Tty()
    AnswerPrinter(pipe).write(ops)
    AnswerPrinter(tty).write(ops)
    assert pipe.getvalue() == "x = 1 + 2"
    assert "\033[2m1 + 1" in tty.getvalue() and tty.getvalue().endswith("\0338\033[J+ 2")
