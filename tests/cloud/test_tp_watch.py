"""Rank 0's watch over the other ranks: its reading of their heartbeats
(tensor_parallel.verdict, over plain data), and a rank stopped (SIGSTOP) under a pass that
waits on it in an in-process rank 0 (tp_launch.local_group)."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("torch")

from acespec.cloud.target.tensor_parallel import (  # noqa: E402
    STALL_FACTOR,
    GroupLost,
    RankState,
    verdict,
)

T = 5.0  # the heartbeat timeout of these cases
NOW = 1000.0


def rank(alive_ago: float = 0.2, moved_ago: float = 0.2, taken: int = 10,
         reduces: int = 80) -> RankState:
    return RankState(NOW - alive_ago, NOW - moved_ago, "7.1", taken, reduces)


def test_ranks_that_beat_and_keep_up_are_no_news():
    ranks = {1: rank(), 2: rank(alive_ago=0.4)}
    assert verdict(NOW, T, ranks, {}, None, NOW - 1.0) is None
    assert verdict(NOW, T, ranks, {11: NOW - 0.3}, NOW - 0.3, NOW - 0.1) is None


def test_a_silent_heartbeat_names_the_rank_and_how_long():
    ranks = {1: rank(), 2: rank(alive_ago=T + 0.3)}
    assert verdict(NOW, T, ranks, {}, None, NOW) == \
        "rank 2 stopped answering (no heartbeat for 5.3 s)"
    assert verdict(NOW, T, {1: rank(alive_ago=T - 0.1)}, {}, None, NOW) is None


def test_a_rank_that_beats_but_takes_no_step_is_lost_after_the_timeout():
    """Its main thread hangs outside the group's collectives; its beat thread still runs."""
    ranks = {1: rank(moved_ago=30.0, taken=10)}
    assert verdict(NOW, T, ranks, {11: NOW - (T - 0.1)}, NOW - 1, NOW) is None
    assert verdict(NOW, T, ranks, {11: NOW - (T + 0.2)}, NOW - 1, NOW) == \
        "rank 1 stopped answering (its heartbeat runs, but it has not taken step 11 for 5.2 s)"


def test_a_rank_stopped_just_after_a_step_is_silent_not_behind():
    """Its last beat was written before it took the step: only the silence tells."""
    ranks = {1: rank(alive_ago=T - 0.1, moved_ago=40.0, taken=10)}  # beat 0.1 s after
    assert verdict(NOW, T, ranks, {11: NOW - T - 0.2}, NOW - T - 0.2, NOW) is None
    ranks[1].alive_at = NOW - T - 0.1
    assert verdict(NOW, T, ranks, {11: NOW - T - 0.2}, NOW - T - 0.2, NOW) == \
        "rank 1 stopped answering (no heartbeat for 5.1 s)"


def test_a_heartbeat_read_late_is_not_a_rank_behind():
    """A beat is up to BEAT_S old when read: the rank seems a step behind, just sent."""
    ranks = {1: rank(moved_ago=40.0, taken=10)}  # a long pass just ended
    assert verdict(NOW, T, ranks, {11: NOW - 0.6}, NOW - 0.6, NOW - 0.6) is None


def test_a_slow_pass_is_not_a_hang_until_no_rank_progresses_for_the_stall_bound():
    stall = STALL_FACTOR * T
    ranks = {1: rank(moved_ago=stall - 1, taken=11)}  # took the pass, computing since
    assert verdict(NOW, T, ranks, {11: NOW - stall}, NOW - stall, NOW - stall) is None
    ranks = {1: rank(moved_ago=stall + 2, taken=11)}
    assert verdict(NOW, T, ranks, {11: NOW - stall - 3}, NOW - stall - 3, NOW - stall - 2) == \
        f"a pass made no progress on any rank for {stall + 2:.1f} s"
    # idle (no pass running): ranks that move no counters are not hung
    assert verdict(NOW, T, ranks, {}, None, NOW - 100) is None


def test_rank_state_times_its_beat_and_its_progress_apart():
    s = RankState(0.0, 0.0)
    s.observe("42.1 3 24", 1.0)
    s.observe("42.2 3 24", 2.0)  # alive, no progress
    assert (s.alive_at, s.moved_at, s.taken, s.reduces) == (2.0, 1.0, 3, 24)
    s.observe("42.2 4 24", 3.0)  # progress read before the next beat
    assert (s.alive_at, s.moved_at, s.taken) == (2.0, 3.0, 4)


@pytest.mark.slow
def test_a_stopped_rank_fails_the_pass_waiting_on_it():
    from acespec.cloud.target.tp_launch import local_group
    from acespec.models import DEMO_TARGET

    reasons: list[str] = []
    with local_group(DEMO_TARGET, 2, threads=1, on_failure=reasons.append,
                     heartbeat_s=2.0) as model:
        cache = model.new_cache()
        model.forward([1, 2, 3], cache)
        rank1 = model.tp.children[0]
        os.kill(rank1.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(GroupLost, match=r"^tensor parallelism lost: rank 1 stopped "
                               r"answering \(no heartbeat for 2\.\d s\)$"):
                model.forward([4], cache)  # waits in an all-reduce until rank 1 is found
            took = time.monotonic() - t0
        finally:
            if rank1.poll() is None:
                os.kill(rank1.pid, signal.SIGCONT)
                rank1.kill()
        assert rank1.wait(5) == -signal.SIGKILL  # killed by rank 0: no orphan
        assert 1.5 < took < 6, took
        assert len(reasons) == 1 and model.tp.broken == reasons[0]
        with pytest.raises(GroupLost, match="rank 1 stopped answering"):  # later passes too
            model.forward([5], cache)
