"""Runs armed ahead (:mod:`judgequeue.core.judges.lane`): an armed box never runs its program before
it is let go, gets its own stdin, is killed when unused or when its run is cancelled, and leaves
nothing on the host. Needs root (CI runs as root)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from judgequeue.core.judges.cgroups import BoxGroup
from judgequeue.core.judges.isolation import JudgeSettings
from judgequeue.core.judges.lane import Lane
from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox import BOX, Armed, Limits, arm, discard, run
from tests.support.sandbox_host import assert_host_clean, box_uids, processes_of
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("as_root")

PYTHON = "/usr/bin/python3"
ECHO_TWICE = "import sys\nprint(int(sys.stdin.read()) * 2)\n"
LIMITS = Limits(cpu=2.0, wall=5.0, memory=256 << 20)
ECHO_ARGV = [PYTHON, "-I", "-S", "-B", f"{BOX}/main.py"]


@pytest.fixture(scope="module")
def judge(sandbox_dir: str) -> Iterator[ProgramJudge]:
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=4)
    assert j.isolation.mode == "full" and j.roots is not None
    yield j
    j.close()


def make_box(directory: str, uid: int) -> None:
    os.mkdir(directory, 0o700)
    os.chown(directory, uid, uid)
    Path(directory, "main.py").write_text(ECHO_TWICE)
    os.chmod(os.path.join(directory, "main.py"), 0o644)


@pytest.fixture
async def box(judge: ProgramJudge) -> AsyncIterator[tuple[str, int, tuple[BoxGroup, BoxGroup]]]:
    """Slot 0's box directory with the echo program, its uid and its two group sets; the host is
    checked afterwards."""
    assert judge.roots is not None
    uid = judge.uid_base
    directory = os.path.join(judge.boxes_dir, "0")
    await asyncio.to_thread(make_box, directory, uid)
    named = f"{judge.group_prefix}0"
    yield directory, uid, (BoxGroup(judge.roots, f"{named}-a"), BoxGroup(judge.roots, f"{named}-b"))
    await asyncio.to_thread(shutil.rmtree, directory)
    await assert_host_clean(judge)


def commands_in(group: BoxGroup) -> list[str]:
    names = []
    for pid in group.pids_in():
        try:
            with open(f"/proc/{pid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return names


def blocked_on_go(group: BoxGroup) -> bool:
    """Whether bubblewrap's namespace init is in its read of the go pipe (``--block-fd``)."""
    for pid in group.pids_in():
        try:
            with open(f"/proc/{pid}/comm") as f, open(f"/proc/{pid}/syscall") as g, open(f"/proc/{pid}/wchan") as w:
                if f.read().strip() == "bwrap" and g.read().split()[0] == "0" and "pipe_read" in w.read():
                    return True
        except OSError:
            continue
    return False


def lane_of(
    judge: ProgramJudge, box: tuple[str, int, tuple[BoxGroup, BoxGroup]]
) -> tuple[Lane, tuple[BoxGroup, BoxGroup]]:
    directory, uid, groups = box
    return Lane(box=directory, uid=uid, isolation=judge.isolation, groups=groups), groups


async def armed_and_blocked(judge: ProgramJudge, directory: str, uid: int, group: BoxGroup) -> Armed:
    """The echo program armed in ``group``, once bubblewrap waits on its go pipe."""
    armed = await arm(ECHO_ARGV, box=directory, uid=uid, limits=LIMITS, isolation=judge.isolation, group=group)
    await eventually(lambda: blocked_on_go(group), within=10, what="the armed box never reached its block")
    return armed


async def test_an_armed_box_waits_for_its_go_and_gets_the_stdin_given_then(
    judge: ProgramJudge, box: tuple[str, int, tuple[BoxGroup, BoxGroup]]
) -> None:
    directory, uid, (group, _) = box
    armed = await armed_and_blocked(judge, directory, uid, group)
    assert "python3" not in commands_in(group)
    assert group.cpu_ns() > 0  # the engine's setup is accounted to the run, as before arming
    facts = await run(ECHO_ARGV, box=directory, uid=uid, stdin=b"21", limits=LIMITS, isolation=judge.isolation,
                      group=group, armed=armed)  # fmt: skip
    assert (facts.exit_code, facts.stdout) == (0, b"42\n"), facts
    assert not group.leftover()


async def test_an_unused_armed_box_is_killed_before_its_program_ever_runs(
    judge: ProgramJudge, box: tuple[str, int, tuple[BoxGroup, BoxGroup]]
) -> None:
    directory, uid, (group, _) = box
    armed = await armed_and_blocked(judge, directory, uid, group)
    await discard(armed)
    assert armed.proc.returncode is not None
    assert not group.leftover()
    assert processes_of(box_uids(judge)) == []


async def test_a_lane_arms_each_next_test_and_kills_the_last_armed(
    judge: ProgramJudge, box: tuple[str, int, tuple[BoxGroup, BoxGroup]]
) -> None:
    lane, groups = lane_of(judge, box)
    outputs = [(await lane.run(ECHO_ARGV, stdin=str(n).encode(), limits=LIMITS, ahead=True)).stdout for n in range(5)]
    assert outputs == [f"{2 * n}\n".encode() for n in range(5)]
    assert (lane.cold, lane.ahead_used) == (1, 4)
    # A run with other limits cannot use what was armed: it is killed and the run starts cold.
    other = await lane.run(ECHO_ARGV, stdin=b"4", limits=replace(LIMITS, memory=128 << 20), ahead=True)
    assert (other.exit_code, other.stdout, lane.cold) == (0, b"8\n", 2)
    await lane.close()
    assert not any(g.leftover() for g in groups)


async def test_cancelling_a_lane_run_kills_the_run_and_what_it_armed(
    judge: ProgramJudge, box: tuple[str, int, tuple[BoxGroup, BoxGroup]]
) -> None:
    lane, groups = lane_of(judge, box)
    await lane.run(ECHO_ARGV, stdin=b"1", limits=LIMITS, ahead=True)
    # The next run's program sleeps; it is cancelled while it runs (and has armed the one after).
    hanging = asyncio.create_task(lane.run(["/bin/sh", "-c", "sleep 30"], stdin=b"", limits=LIMITS, ahead=True))
    await eventually(lambda: any(g.pids_in() for g in groups), within=10, what="the run never started")
    hanging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hanging
    await lane.close()
    assert not any(g.leftover() for g in groups)
