"""Uplink pacing: the tree's unsent nodes go up in one message just in time for the
verifier's next pass start (it applies what has arrived at each start), one message per
start; and on a real emulated link the tree sends about one message per verifier pass."""

from __future__ import annotations

import pytest

from acespec.edge.session.pacing import until_due

# A verifier pass of 40 ms that ended (edge clock) at t = 1.000; a message needs 30 ms to
# get there (one way, its serialisation and a margin), so its moments are 1.010, 1.050, ...
PASS, END, LEAD, LATE = 0.040, 1.000, 0.030, 0.004


@pytest.mark.parametrize("now, wait, start", [
    (1.000, 0.010, 1.040),  # 10 ms before the moment for the start at 1.040
    (1.009, 0.001, 1.040),
    (1.010, 0.0, 1.040),  # the moment itself
    (1.013, 0.0, 1.040),  # 3 ms late: the margin still makes 1.040
    (1.015, 0.035, 1.080),  # 5 ms late: too late for 1.040; wait for the moment for 1.080
    (1.049, 0.001, 1.080),
    (2.010, 0.0, 2.040),  # many passes on: the same phase
])
def test_a_message_is_due_at_the_moment_that_makes_the_next_pass_start(now, wait, start):
    assert until_due(now, END, PASS, LEAD, LATE) == (pytest.approx(wait, abs=1e-9),
                                                     pytest.approx(start, abs=1e-9))


def test_one_message_per_pass_start():
    due, start = until_due(1.011, END, PASS, LEAD, LATE)
    assert (due, start) == (0.0, pytest.approx(1.040))
    # Sent at 1.011 for the start at 1.040: at 1.013 another is not due until the next,
    assert until_due(1.013, END, PASS, LEAD, LATE, aimed=start) == \
        (pytest.approx(0.037), pytest.approx(1.080))
    # nor when a newer Decided moves the clock by 2 ms (still the start near 1.040),
    assert until_due(1.013, END + 0.002, PASS, LEAD, LATE, aimed=start)[0] > 0.03
    # while a message aimed at the start before (1.000) does not hold this one.
    assert until_due(1.013, END, PASS, LEAD, LATE, aimed=1.000)[0] == 0.0


def test_an_unknown_pass_time_never_holds_a_message():
    assert until_due(1.013, END, 0.0, LEAD, LATE) == (0.0, 1.013)
