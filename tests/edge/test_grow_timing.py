"""The grow driver's P(in time | lead): a line draft counts as in time when the verifier had
applied the uplink message that carried it before the pass that decided its position
(Decided.acked). The prior is the round-trip model (a node whose lead is short of the
verifier's advance while it travels is late); judged drafts update their lead's bin, and
guesses are worth their hit only with that probability."""

from __future__ import annotations

from types import SimpleNamespace

from acespec.edge.session.grow import GrowDriver
from acespec.edge.speculation.branches import CacheStats
from acespec.edge.speculation.calibration import TimingModel
from acespec.edge.speculation.grow_tree import Node


def test_the_prior_is_the_round_trip_model_and_data_overrule_it():
    t = TimingModel()
    assert t.p(6, ahead=3.5) == TimingModel.EARLY and t.p(2, ahead=3.5) == TimingModel.LATE
    for _ in range(20):  # drafts sent 6 ahead keep arriving late after all
        t.observe(6, False)
    assert t.p(6, ahead=3.5) < 0.1 and t.p(7, ahead=3.5) == TimingModel.EARLY
    for _ in range(20):  # and drafts sent 2 ahead arrive in time (a slow verifier)
        t.observe(2, True)
    assert t.p(2, ahead=3.5) > 0.9
    t.observe(500, True)  # a lead past the table counts in its last bin
    assert t.judged[-1] == 1


def _driver(applied: int) -> SimpleNamespace:
    return SimpleNamespace(applied=applied, timing=TimingModel(),
                           run=SimpleNamespace(stats=SimpleNamespace(cache=CacheStats())))


def _judge(d, sent_in: int, lead: int = 4) -> None:
    GrowDriver._judge_timing(d, Node(7, 10, None, sent_in=sent_in, lead=lead))


def test_a_draft_is_in_time_when_its_message_was_applied_before_the_deciding_pass():
    d = _driver(applied=3)
    _judge(d, 3)  # carried by the 3rd message, 3 applied: in time
    _judge(d, 4)  # sent after what the verifier held: late
    cache = d.run.stats.cache
    assert (cache.drafts_judged, cache.drafts_in_time, cache.in_time_rate) == (2, 1, 0.5)
    assert d.timing.judged[4] == 2 and d.timing.held[4] == 1


def test_unsent_drafts_and_a_verifier_that_never_acknowledges_teach_nothing():
    d = _driver(applied=0)  # an older verifier: Decided.acked is always 0
    _judge(d, 2)
    d.applied = 4
    _judge(d, 0)  # never sent (still in the tree's unsent list)
    assert d.run.stats.cache.drafts_judged == 0 and d.timing.judged.sum() == 0
