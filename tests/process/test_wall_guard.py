"""The wall guard on a loaded worker: a program that spins gets TIME_LIMIT, one that sleeps gets
IDLENESS_LIMIT, however few CPU cycles the machine gives it.

The worker (this process, and so every box it starts) and four CPU hogs share one CPU, so a box
gets about a fifth of it: its wall time runs about five times faster than its CPU time. A guard
that counted plain wall time stopped the spinner for idleness at 2 x 0.5 + 0.5 s with ~0.35 s of
CPU; the guard leaves out the time a run waited for a CPU. Needs root (CI runs as root).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox.isolation import JudgeSettings

pytestmark = pytest.mark.usefixtures("as_root")

HOGS = 4
SPIN = {"language": "python", "source": "while True:\n    pass\n", "tests": [{"input": "", "output": ""}],
        "limits": {"time": 0.5}}
SLEEP = {"language": "python", "source": "import time\ntime.sleep(60)\n", "tests": [{"input": "", "output": ""}],
         "limits": {"time": 0.5}}


@pytest.fixture
def one_loaded_cpu() -> Iterator[None]:
    """This process on one CPU with spinning processes (its children inherit the affinity)."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    # Each in a session of its own, as a box is: with autogroup scheduling a session shares the CPU
    # as one, so hogs in one session would leave a box half of it.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(HOGS)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, before)


@pytest.fixture(params=["submission", "test"])
def judge(sandbox_dir: str, request: pytest.FixtureRequest) -> Iterator[ProgramJudge]:
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir, box=request.param), slots=4)
    yield j
    j.close()


async def test_a_starved_spinner_is_a_time_limit_and_a_sleeper_idleness(
    judge: ProgramJudge, one_loaded_cpu: None
) -> None:
    spin = await judge.judge(SPIN)
    assert spin.status == "TIME_LIMIT", spin.details
    test = spin.details["tests"][0]
    assert test["wall_ms"] > 1500, f"the box was not starved, so this proves nothing: {test}"
    sleep = await judge.judge(SLEEP)
    assert sleep.status == "IDLENESS_LIMIT", sleep.details
