"""A box's runs (:mod:`judgequeue.core.judges.sandbox.lane`), armed ahead or in one session.

Armed ahead: an armed box never runs its program before it is let go, gets its own stdin, is killed
when unused or when its run is cancelled. In a session (one box, :mod:`~judgequeue.core.judges.sandbox.box_runner`
running the program per test) the program is hostile: it cannot signal, stop or trace the runner,
reach its channel or fake its report, leave a process, a file or a descriptor to the next test, or
have its use counted to another test; a box that is not provably clean is replaced. Either way
nothing is left on the host. A test in a session gets a memory group of its own: its memory figure,
limit and OOM kills are its alone, as in a box of its own. Needs root (CI runs as root)."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox import BOX, Armed, Limits, RunFacts, arm, discard, run
from judgequeue.core.judges.sandbox.cgroups import BoxGroup, PerTest, Usage, box_group
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.judges.sandbox.lane import Lane
from tests.support.sandbox_host import CPU_SCALE, assert_host_clean, box_uids, processes_of
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("as_root")

PYTHON = "/usr/bin/python3"
ECHO_TWICE = "import sys\nprint(int(sys.stdin.read()) * 2)\n"
LIMITS = Limits(cpu=2.0 * CPU_SCALE, wall=5.0 * CPU_SCALE, memory=256 << 20)
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
    yield directory, uid, (box_group(judge.roots, f"{named}-a"), box_group(judge.roots, f"{named}-b"))
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
    judge: ProgramJudge, box: tuple[str, int, tuple[BoxGroup, BoxGroup]], *, sessions: bool = False
) -> tuple[Lane, tuple[BoxGroup, BoxGroup]]:
    directory, uid, groups = box
    python = judge.tools["python3"] if sessions else None
    return Lane(box=directory, uid=uid, isolation=judge.isolation, groups=groups, python=python), groups


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
    assert processes_of(box_uids(judge), judge.group_prefix) == []


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


# --- sessions: one box, the runner inside it -------------------------------------------------------


def python_run(directory: str, source: str) -> list[str]:
    """Write ``source`` as the box's program; the argv that runs it."""
    path = os.path.join(directory, "main.py")
    Path(path).write_text(source)
    os.chmod(path, 0o644)
    return ECHO_ARGV


@pytest.fixture
async def session_lane(judge: ProgramJudge, box: tuple[str, int, tuple[BoxGroup, BoxGroup]]) -> AsyncIterator[Lane]:
    """A lane with sessions on slot 0's box, closed (its box killed) even when the test fails."""
    lane, _ = lane_of(judge, box, sessions=True)
    yield lane
    await lane.close()


async def session_runs(lane: Lane, argv: list[str], inputs: list[bytes], limits: Limits = LIMITS) -> list[RunFacts]:
    """Run ``inputs`` as one submission's tests (every run but the last has a next test)."""
    return [
        await lane.run(argv, stdin=given, limits=limits, ahead=n < len(inputs) - 1) for n, given in enumerate(inputs)
    ]


async def test_a_session_runs_every_test_in_one_box(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane
) -> None:
    groups, lane = box[2], session_lane
    facts = await session_runs(lane, ECHO_ARGV, [str(n).encode() for n in range(5)])
    assert [f.stdout for f in facts] == [f"{2 * n}\n".encode() for n in range(5)]
    assert (lane.sessions, lane.in_session, lane.cold) == (1, 5, 0)
    assert all(f.exit_code == 0 and f.signal is None and 0 < f.cpu < CPU_SCALE for f in facts), facts
    await lane.close()
    assert not any(g.leftover() for g in groups)
    # A lone test (nothing follows it) is cheaper cold than a session.
    lone = await lane.run(ECHO_ARGV, stdin=b"3", limits=LIMITS, ahead=False)
    assert (lone.stdout, lane.sessions, lane.cold) == (b"6\n", 1, 1)


RUNNER_ATTACK = """
import ctypes, errno, os, signal, sys
said = []
for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
    try:
        os.kill(1, sig)  # the runner is the namespace's init: the kernel drops these
        said.append("sent")
    except OSError as exc:
        said.append(errno.errorcode[exc.errno])
libc = ctypes.CDLL(None, use_errno=True)
said.append(str(libc.ptrace(16, 1, 0, 0)))  # PTRACE_ATTACH: seccomp says EPERM
for path in ("/proc/1/mem", "/proc/1/fd", "/proc/self/fd"):
    said.append(str(os.path.exists(path)))
# Every descriptor but 0, 1 and 2 must be closed: none reaches the runner's channel.
open_fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
said.append(repr(open_fds))
print(int(sys.stdin.read()) * 2, " ".join(said))
"""


async def test_the_program_cannot_signal_trace_or_reach_the_runner(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane
) -> None:
    directory, lane = box[0], session_lane
    argv = await asyncio.to_thread(python_run, directory, RUNNER_ATTACK)
    facts = await session_runs(lane, argv, [b"1", b"2", b"3"])
    lines = [f.stdout.decode().split() for f in facts]
    assert [line[0] for line in lines] == ["2", "4", "6"], facts  # each test ran, and was reported
    for line in lines:
        assert line[1:7] == ["sent"] * 6 and line[7] == "-1", line  # signals dropped, ptrace refused
        assert line[8:11] == ["False", "False", "False"] and line[11] == "[]", line  # no /proc, no channel
    assert (lane.sessions, lane.in_session) == (1, 3)  # the runner survived every attempt
    await lane.close()


LEAVE_BEHIND = """
import os, sys, time
n = int(sys.stdin.read())
if n == 1:
    os.makedirs("/tmp/deep/er")
    open("/tmp/deep/er/file", "w").write("x")
    os.chmod("/tmp/deep/er", 0)
    os.chmod("/tmp/deep", 0o500)
    open("/tmp/left", "w").write("x")
    if os.fork() == 0:  # a daemon: its own session, it would write into the next test's output
        os.setsid()
        while True:
            time.sleep(0.001)
            for fd in range(3):
                try:
                    os.write(fd, b"FROM THE DAEMON")
                except OSError:
                    pass
    print("left")
else:
    others = []
    for pid in range(2, 4096):
        if pid != os.getpid():
            try:
                os.kill(pid, 0)
                others.append(pid)
            except ProcessLookupError:
                pass
    print(sorted(os.listdir("/tmp")), others)
"""


async def test_nothing_of_a_test_reaches_the_next(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane
) -> None:
    directory, lane = box[0], session_lane
    argv = await asyncio.to_thread(python_run, directory, LEAVE_BEHIND)
    first, second, third = await session_runs(lane, argv, [b"1", b"2", b"3"])
    # The daemon may write into its own test's output while that test lasts (before or after the
    # test's own line: the two processes are not ordered), never into the next's.
    assert first.exit_code == 0 and first.killed_for is None, first
    assert first.stdout.replace(b"FROM THE DAEMON", b"") == b"left\n", first
    assert second.stdout == third.stdout == b"[] []\n", (second, third)  # no file, no process
    assert (lane.sessions, lane.in_session) == (1, 3)
    await lane.close()


ACCOUNTED = """
import sys, time
n = int(sys.stdin.read())
if n == 1:  # a heavy test: 0.3 s of CPU and 100 MiB
    block = bytearray(100 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
elif n == 3:
    block = bytearray(300 << 20)  # over the limit
    for i in range(0, len(block), 4096):
        block[i] = 1
elif n == 4:
    while True:
        pass
elif n == 5:
    time.sleep(60)
print(n)
"""


async def test_each_test_is_accounted_and_limited_alone(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane
) -> None:
    directory, lane = box[0], session_lane
    argv = await asyncio.to_thread(python_run, directory, ACCOUNTED)
    cpu = 0.8 * CPU_SCALE  # the heavy test's start, its 100 MiB and its 0.3 s fit under it, on a busy machine too
    limits = replace(LIMITS, cpu=cpu, wall=2 * cpu)
    inputs = [str(n).encode() for n in range(1, 7)]
    heavy, light, oom, spin, sleeper, last = await session_runs(lane, argv, inputs, limits)
    assert heavy.stdout == b"1\n" and heavy.cpu >= 0.3 and heavy.memory_peak >= 100 << 20, heavy
    # Nothing of the heavy test is counted to the light one.
    assert light.stdout == b"2\n" and light.cpu < 0.4 * cpu and light.memory_peak < 50 << 20, light
    assert oom.oom_killed and oom.signal == 9, oom  # the group's limit is the test's, the runner's use on top
    assert spin.killed_for == "cpu" and cpu <= spin.cpu < 2 * cpu and not spin.oom_killed, spin
    assert sleeper.killed_for == "wall" and sleeper.cpu < 0.4 * cpu, sleeper
    assert last.stdout == b"6\n" and last.killed_for is None and not last.oom_killed, last
    assert lane.in_session == 6
    await lane.close()


NESTED = """
import os, sys
n = int(sys.stdin.read())
if n == 1:
    os.makedirs("/tmp/" + "/".join(["d"] * 300))
print(n)
"""


async def test_a_box_that_is_not_clean_is_replaced(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane
) -> None:
    directory, groups, lane = box[0], box[2], session_lane
    # Nested deeper than the runner empties: it says the box is not clean, and the lane replaces it.
    argv = await asyncio.to_thread(python_run, directory, NESTED)
    facts = await session_runs(lane, argv, [b"1", b"2", b"3"])
    assert [f.stdout for f in facts] == [b"1\n", b"2\n", b"3\n"], facts
    assert (lane.sessions, lane.in_session) == (2, 3)
    await lane.close()
    assert not any(g.leftover() for g in groups)


async def test_cancelling_a_session_run_kills_the_box(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane
) -> None:
    groups, lane = box[2], session_lane
    await lane.run(ECHO_ARGV, stdin=b"1", limits=LIMITS, ahead=True)
    sleeper = await asyncio.to_thread(python_run, box[0], "import time\ntime.sleep(30)\n")
    hanging = asyncio.create_task(lane.run(sleeper, stdin=b"", limits=LIMITS, ahead=True))
    await eventually(lambda: len(groups[0].pids_in()) > 2, within=10, what="the test never started")
    hanging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hanging
    await lane.close()
    assert not any(g.leftover() for g in groups)


class Unjoinable(PerTest):
    """A test's accounting whose group the program cannot join (a descriptor it cannot write)."""

    def __init__(self, real: PerTest) -> None:
        self.real = real
        self.join_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)

    def cpu_ns(self) -> int:
        return self.real.cpu_ns()

    def usage(self) -> Usage:
        return self.real.usage()

    def close(self, deadline: float) -> bool:
        os.close(self.join_fd)
        self.join_fd = -1
        return self.real.close(deadline)


async def test_a_program_that_cannot_join_its_tests_group_never_runs_in_the_session(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On cgroup v2 the program joins its test's own group before its exec; when that write fails the
    # runner says "unjoined" instead of running it, and the test runs in a box of its own.
    for group in box[2]:
        real = group.per_test
        monkeypatch.setattr(group, "per_test", lambda real=real, **limits: Unjoinable(real(**limits)))
    facts = await session_runs(session_lane, ECHO_ARGV, [b"4", b"5"])
    assert [f.stdout for f in facts] == [b"8\n", b"10\n"], facts
    # The first test's session broke before its program ran: both ran in boxes of their own.
    assert (session_lane.sessions, session_lane.in_session) == (1, 0)
    assert session_lane.cold + session_lane.ahead_used == 2


# --- a test's memory: a group of its own in the session's box ------------------------------------

#: Touches as many MiB as its input says, then prints the number.
TOUCH_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    long mib = 0;
    if (scanf("%ld", &mib) != 1) return 1;
    size_t size = (size_t)mib << 20;
    char *block = size ? malloc(size) : NULL;
    if (size && !block) return 2;
    if (size) memset(block, 1, size);
    printf("%ld\n", mib + (size ? block[size - 1] - 1 : 0));
    return 0;
}
"""
KIB = 1024
#: How far below a box per test a small program's figure in a shared box may be: a box per test
#: also counts bubblewrap's two processes and its namespaces (about 0.6 MiB here, about twice the
#: program's own), a shared box's test only the program.
BELOW_A_BOX_PER_TEST_KB = 1024
#: How far above: the kernel charges a group in batches of 64 pages (256 KiB).
ABOVE_A_BOX_PER_TEST_KB = 256


def touching(mibs: list[int], memory_mb: int = 256) -> dict[str, Any]:
    """A C submission whose tests touch ``mibs`` MiB each, every test judged (``run_all``)."""
    return {
        "language": "c", "source": TOUCH_C, "tests": [{"input": f"{m}\n", "output": f"{m}\n"} for m in mibs],
        "limits": {"memory_mb": memory_mb, "time": 2 * CPU_SCALE}, "scoring": {"run_all": True},
    }  # fmt: skip


@pytest.fixture(scope="module")
def judge_per_test(sandbox_dir: str) -> Iterator[ProgramJudge]:
    """A judge that gives every test a box of its own (``JUDGEQUEUE_PROGRAM_BOX=test``)."""
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir, box="test"), slots=2)
    yield j
    j.close()


async def memory_kb(judge: ProgramJudge, payload: dict[str, Any]) -> list[int]:
    verdict = await judge.judge(payload)
    assert verdict.status == "ACCEPTED", verdict.details
    return [t["memory_kb"] for t in verdict.details["tests"]]


async def test_a_small_c_programs_memory_is_counted_as_in_a_box_of_its_own(
    judge: ProgramJudge, judge_per_test: ProgramJudge
) -> None:
    # Counted as the growth of the shared box's group, a program this small often showed 0 (its
    # pages came out of the batch the group had already been charged for the runner).
    shared = await memory_kb(judge, touching([0] * 12))
    alone = await memory_kb(judge_per_test, touching([0] * 12))
    assert all(kb > 0 for kb in shared), shared
    below = statistics.median(alone) - statistics.median(shared)
    assert -ABOVE_A_BOX_PER_TEST_KB <= below <= BELOW_A_BOX_PER_TEST_KB, (shared, alone)
    await assert_host_clean(judge)
    await assert_host_clean(judge_per_test)


async def test_a_big_test_between_small_ones_is_counted_to_itself_alone(judge: ProgramJudge) -> None:
    small, big, after = await memory_kb(judge, touching([0, 96, 0]))
    assert big >= 96 * KIB, big
    assert 0 < small < 2 * KIB and 0 < after < 2 * KIB, (small, big, after)  # nothing carried over
    await assert_host_clean(judge)


@pytest.fixture
async def touch_box(box: tuple[str, int, tuple[BoxGroup, BoxGroup]]) -> list[str]:
    """Slot 0's box with TOUCH_C built as its program; the argv that runs it."""
    directory = box[0]
    source = os.path.join(directory, "touch.c")
    await asyncio.to_thread(Path(source).write_text, TOUCH_C)
    built = await asyncio.to_thread(
        subprocess.run, ["gcc", "-O2", "-o", os.path.join(directory, "touch"), source], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    os.chmod(os.path.join(directory, "touch"), 0o755)
    return [f"{BOX}/touch"]


async def test_a_tests_memory_limit_and_oom_kills_are_its_own(touch_box: list[str], session_lane: Lane) -> None:
    # 60 of 64 MiB fit (the runner's memory is not the test's), 70 do not (the box's own limit is
    # the test's plus room for the runner), and the test after the OOM kill runs in the same box
    # with nothing of it counted.
    limits = replace(LIMITS, memory=64 << 20)
    facts = await session_runs(session_lane, touch_box, [b"0", b"60", b"0", b"70", b"0"], limits)
    small, fits, between, over, after = facts
    for f, mib in ((small, 0), (fits, 60), (between, 0), (after, 0)):
        assert (f.exit_code, f.stdout, f.oom_killed) == (0, f"{mib}\n".encode(), False), f
    assert fits.memory_peak >= 60 << 20, fits
    assert over.oom_killed and over.signal == 9 and over.memory_peak <= 64 << 20, over
    assert all(0 < f.memory_peak < 2 << 20 for f in (small, between, after)), facts
    assert (session_lane.sessions, session_lane.in_session) == (1, 5)


#: Two child processes and two threads touch the input's MiB each and hold them until all four have.
TREE_TOUCH = """
import os, sys, threading
mib = int(sys.stdin.read())
def touch():
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return block
gate_r, gate_w = os.pipe()
ready_r, ready_w = os.pipe()
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        block = touch()
        os.write(ready_w, b"k")
        os.read(gate_r, 1)
        os._exit(0)
    kids.append(pid)
os.close(ready_w)  # a child killed before it is ready ends the wait below
held = []
threads = [threading.Thread(target=lambda: held.append(touch())) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ready = b""
while len(ready) < 2:
    got = os.read(ready_r, 2)
    if not got:
        sys.exit(3)
    ready += got
os.write(gate_w, b"go")
for pid in kids:
    os.waitpid(pid, 0)
print(mib)
"""


async def test_a_tests_group_holds_the_programs_whole_tree(
    box: tuple[str, int, tuple[BoxGroup, BoxGroup]], session_lane: Lane
) -> None:
    # The program joins its test's group before its exec: its threads and children are made there.
    argv = await asyncio.to_thread(python_run, box[0], TREE_TOUCH)
    fits, small = await session_runs(session_lane, argv, [b"24", b"0"])
    assert (fits.exit_code, fits.stdout) == (0, b"24\n") and fits.memory_peak >= 96 << 20, fits
    assert small.stdout == b"0\n" and small.memory_peak < 32 << 20, small
    over, after = await session_runs(session_lane, argv, [b"24", b"0"], replace(LIMITS, memory=64 << 20))
    assert over.oom_killed and over.memory_peak <= 64 << 20, over
    assert (after.exit_code, after.stdout, after.oom_killed) == (0, b"0\n", False), after
    assert session_lane.in_session == 4
