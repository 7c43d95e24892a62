"""The grow driver's P(in time): a line draft counts as in time when the verifier had
applied the uplink message that carried it before the pass that decided its position
(Decided.acked); guesses are worth their hit only with that probability."""

from __future__ import annotations

from types import SimpleNamespace

from acespec.edge.session.grow import IN_TIME_PRIOR, IN_TIME_RATE, GrowDriver
from acespec.edge.speculation.branches import CacheStats
from acespec.edge.speculation.grow_tree import GNode


def _driver(applied: int) -> SimpleNamespace:
    return SimpleNamespace(applied=applied, in_time=IN_TIME_PRIOR,
                           run=SimpleNamespace(stats=SimpleNamespace(cache=CacheStats())))


def _judge(d, sent_in: int) -> None:
    GrowDriver._judge_timing(d, GNode(7, 10, None, sent_in=sent_in))


def test_held_and_late_drafts_move_the_estimate_and_are_counted():
    d = _driver(applied=3)
    _judge(d, 3)  # carried by the 3rd message, 3 applied: in time
    assert d.in_time == IN_TIME_PRIOR + IN_TIME_RATE * (1 - IN_TIME_PRIOR)
    high = d.in_time
    d.applied = 3
    _judge(d, 4)  # sent after what the verifier held: late
    assert d.in_time == high + IN_TIME_RATE * (0 - high)
    cache = d.run.stats.cache
    assert (cache.drafts_judged, cache.drafts_in_time, cache.in_time_rate) == (2, 1, 0.5)


def test_always_late_drafts_drive_the_estimate_towards_zero():
    d = _driver(applied=1)
    for _ in range(60):
        _judge(d, 5)
    assert d.in_time < 0.01 and d.run.stats.cache.in_time_rate == 0.0


def test_unsent_drafts_and_a_verifier_that_never_acknowledges_leave_the_prior():
    d = _driver(applied=0)  # an older verifier: Decided.acked is always 0
    _judge(d, 2)
    d.applied = 4
    _judge(d, 0)  # never sent (still in the tree's unsent list)
    assert d.in_time == IN_TIME_PRIOR and d.run.stats.cache.drafts_judged == 0
