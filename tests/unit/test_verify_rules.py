"""The pure rules of ``judgequeue problem verify``: problemtools' time limit from the slowest
accepted solution, and which solutions bound it."""

from __future__ import annotations

import pytest

from judgequeue.core.judges.program.archives import PackageDir
from judgequeue.core.judges.program.archives.common import Timing
from judgequeue.core.verify import derive_time_limit, lower_bounds_time_limit

LEGACY = Timing(5.0, 2.0, 1.0)


@pytest.mark.parametrize(
    ("slowest", "timing", "limit"),
    [
        (0.017, LEGACY, 1.0),  # never under one step (problemtools' hello: "setting timelim to 1 secs")
        (0.2, LEGACY, 1.0),  # exactly one step is one step, not two
        (0.21, LEGACY, 2.0),
        (0.5, LEGACY, 3.0),
        (0.5, Timing(), 1.0),  # 2023-07: times 2
        (0.51, Timing(), 2.0),
        (0.3, Timing(2.0, 1.5, 0.25), 0.75),  # a finer resolution
        (0.0, Timing(), 1.0),
    ],
)
def test_the_time_limit_is_problemtools(slowest: float, timing: Timing, limit: float) -> None:
    assert derive_time_limit(slowest, timing) == pytest.approx(limit)


def test_which_solutions_bound_the_time_limit() -> None:
    kattis = PackageDir("p", None, {"format": "kattis"}, {})
    assert lower_bounds_time_limit(kattis, {"name": "accepted/a.py", "expected": ["ACCEPTED"]})
    assert not lower_bounds_time_limit(kattis, {"name": "partially_accepted/a.py", "expected": ["ACCEPTED"]})
    polygon = PackageDir("p", 1, {"format": "polygon"}, {})
    assert lower_bounds_time_limit(polygon, {"name": "solutions/main.cpp", "expected": ["ACCEPTED"]})
    tle_or_ac = {"name": "solutions/slow.cpp", "expected": ["TIME_LIMIT", "IDLENESS_LIMIT", "ACCEPTED"]}
    assert not lower_bounds_time_limit(polygon, tle_or_ac)
