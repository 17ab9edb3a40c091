"""The wake-up's and the takes' pure rules, by name: ``wakeup.keep_listening`` (shared by the
dispatcher and direct intake), ``direct.takes.pace_takes`` and ``direct.takes.TakeRate``
(docs/design.md §1)."""

from __future__ import annotations

import pytest

from judgequeue.core.roles.worker.direct.takes import TakeRate, pace_takes
from judgequeue.core.roles.worker.direct.tuning import PACE_TAKES_ABOVE, TAKE_RATE_WINDOW
from judgequeue.core.runtime.wakeup import BUSY_STREAK, keep_listening


def test_keep_listening_only_for_a_trickle() -> None:
    assert keep_listening(1, 100, 1)
    assert keep_listening(99, 100, BUSY_STREAK - 1)
    assert not keep_listening(100, 100, 1)  # a full batch: more is probably waiting
    assert not keep_listening(1, 100, BUSY_STREAK)  # work every cycle: polling is cheaper
    assert not keep_listening(0, 100, 0)


def test_takes_are_paced_only_while_work_flows_fast() -> None:
    fast = PACE_TAKES_ABOVE
    assert pace_takes(2, 64, BUSY_STREAK, fast)  # a streak of takes finding a row or two: let rows gather
    assert not pace_takes(2, 64, BUSY_STREAK - 1, fast)  # not a streak yet: a trickle is a notification's
    assert not pace_takes(64, 64, BUSY_STREAK, fast)  # every free slot filled: the slots are the limit
    assert not pace_takes(0, 64, BUSY_STREAK, fast)  # nothing found: the wait is the notification's
    assert not pace_takes(2, 64, BUSY_STREAK, fast - 1)  # offers' rates: each take at once, for latency


def test_the_take_rate_leaves_out_the_first_take_and_follows_the_latest_window() -> None:
    rate = TakeRate()
    rate.start(10.0)  # the first take's rows gathered while it waited: not counted
    rate.add(3, 10.001)
    rate.add(3, 10.002)
    assert rate.per_second == pytest.approx(3000)
    rate.add(0, 10.0 + TAKE_RATE_WINDOW)  # the window ends: its rate stands until the next has one
    assert rate.per_second == pytest.approx(6 / TAKE_RATE_WINDOW)
    rate.add(1, 10.0 + TAKE_RATE_WINDOW + 0.01)
    assert rate.per_second == pytest.approx(100)
    rate.start(20.0)
    assert rate.per_second == 0.0
