"""The program judge on cgroup v2, in the VM: how a worker claims its delegated cgroup, how a
submission's box gives each test a cgroup of its own, and the one line a worker says when the
subtree is not its to use. Runs as root inside the VM only (``tests/vm/test_cgroup_v2.py`` boots it).

Each worker here is started in a fresh cgroup of its own at the top of the tree, as a container
runtime or a systemd unit with ``Delegate=yes`` would give it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from judgequeue.core.judges.program import ProgramJudge
from judgequeue.core.judges.sandbox import BOX, Limits
from judgequeue.core.judges.sandbox.cgroups import BoxGroup, V2Roots, box_group
from judgequeue.core.judges.sandbox.cgroups.v2 import LEAF, RUNNER, V2Group
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from judgequeue.core.judges.sandbox.lane import Lane
from tests.support.databases import REDIS_URL
from tests.support.redis_servers import free_port
from tests.support.roles import http_get, stop_process, wait_serving
from tests.support.sandbox_host import assert_host_clean, fail_closed_worker_env
from tests.support.waiting import eventually, wait_for

pytestmark = pytest.mark.usefixtures("as_root")

CGROUP = "/sys/fs/cgroup"
#: Run the rest of the command line in the cgroup directory given first (written before the exec).
JOIN = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
DELEGATE = "give the worker a delegated cgroup (a container cgroup namespace with a writable /sys/fs/cgroup"


def in_cgroup(path: str, argv: list[str]) -> list[str]:
    return ["/bin/sh", "-c", JOIN, "sh", path, *argv]


def remove_cgroup(path: str) -> None:
    """Kill what is left in ``path`` and remove it with everything below it."""
    if not os.path.isdir(path):
        return
    Path(path, "cgroup.kill").write_text("1")
    wait_for(lambda: "populated 0" in Path(path, "cgroup.events").read_text(), 10, f"{path} emptied")
    for top, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
        os.rmdir(top)


@pytest.fixture
def fresh_cgroup() -> Iterator[str]:
    path = f"{CGROUP}/jqvm-{uuid.uuid4().hex[:8]}"
    os.mkdir(path)
    yield path
    remove_cgroup(path)


def controllers(path: str, name: str = "cgroup.subtree_control") -> set[str]:
    return set(Path(path, name).read_text().split())


def procs(path: str) -> set[int]:
    return {int(p) for p in Path(path, "cgroup.procs").read_text().split()}


WORKER = """
import asyncio, json, sys
from judgequeue.core.judges.sandbox.isolation import JudgeSettings
from tests.support.sandbox_host import CPU_SCALE
from judgequeue.core.judges.program import ProgramJudge

judge = ProgramJudge(settings=JudgeSettings(sandbox_dir=sys.argv[1]), slots=2)
own = open("/proc/self/cgroup").read().strip()
source = '''
n = int(input())
if n == 2:
    block = bytearray(96 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
print(2 * n)
'''
tests = [{"input": str(n), "output": str(2 * n)} for n in range(5)]
payload = {"language": "python", "source": source, "tests": tests, "limits": {"time": 2 * CPU_SCALE}}
verdict = asyncio.run(judge.judge(payload))
print(json.dumps({"version": judge.roots.version, "roots": judge.roots.all(), "own": own,
                  "status": verdict.status, "tests": verdict.details["tests"]}))
"""


def judge_in(cgroup: str, sandbox_dir: str) -> dict[str, object]:
    done = subprocess.run(
        in_cgroup(cgroup, [sys.executable, "-c", WORKER, sandbox_dir]), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_a_worker_claims_its_delegated_cgroup_and_boxes_go_beside_its_leaf(fresh_cgroup: str, sandbox_dir: str) -> None:
    # Another process of the worker's cgroup (a container's other process): it is moved with the worker.
    neighbour = subprocess.Popen(in_cgroup(fresh_cgroup, ["sleep", "600"]))
    try:
        wait_for(lambda: neighbour.pid in procs(fresh_cgroup), 10, "the neighbour in the fresh cgroup")
        report = judge_in(fresh_cgroup, sandbox_dir)
        leaf = os.path.join(fresh_cgroup, LEAF)
        assert report["version"] == 2 and report["roots"] == [fresh_cgroup], report
        assert report["own"] == f"0::{leaf.removeprefix(CGROUP)}", report
        assert report["status"] == "ACCEPTED", report
        assert procs(fresh_cgroup) == set() and neighbour.pid in procs(leaf)
        assert {"memory", "pids"} <= controllers(fresh_cgroup)
        assert "cpu" in controllers(fresh_cgroup)  # offered here: the leaf and each box share the CPU fairly
        # Nothing of the boxes is left: the worker's leaf is the only cgroup in its subtree.
        assert [e.name for e in os.scandir(fresh_cgroup) if e.is_dir()] == [LEAF]
        # Each test's memory peak is its own (Linux 6.1 cannot reset a peak: a cgroup per test).
        peaks = [t["memory_kb"] for t in report["tests"]]  # type: ignore[attr-defined]
        assert peaks[2] >= 96 * 1024 and all(p < 48 * 1024 for n, p in enumerate(peaks) if n != 2), peaks

        # A second worker started inside the leaf (a restarted judge) claims the same subtree.
        again = judge_in(leaf, os.path.join(sandbox_dir, "again"))
        assert again["roots"] == [fresh_cgroup] and again["own"] == report["own"] and again["status"] == "ACCEPTED"
        assert [e.name for e in os.scandir(fresh_cgroup) if e.is_dir()] == [LEAF]
    finally:
        neighbour.kill()
        neighbour.wait()


#: A container's view: a cgroup namespace rooted at the worker's cgroup, and /sys/fs/cgroup either
#: the namespace's own cgroup2 mount (what a runtime gives, made writable) or the host's whole tree
#: (a hostPath of /sys/fs/cgroup), whose mount root the namespace sees as "/..".
CONTAINER = {
    "own-mount": 'umount /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$@"',
    "host-mount": 'exec "$@"',
}


@pytest.mark.parametrize("mount", list(CONTAINER))
def test_a_worker_in_a_container_cgroup_namespace_claims_its_cgroup(
    fresh_cgroup: str, sandbox_dir: str, mount: str
) -> None:
    unshare = ["unshare", "--cgroup", "--mount", "--propagation", "private", "/bin/sh", "-c", CONTAINER[mount], "sh"]
    done = subprocess.run(
        in_cgroup(fresh_cgroup, [*unshare, sys.executable, "-c", WORKER, sandbox_dir]),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["own"] == f"0::/{LEAF}" and report["status"] == "ACCEPTED", report  # as the namespace sees it
    assert report["roots"] == [CGROUP if mount == "own-mount" else fresh_cgroup], report
    assert {"memory", "pids"} <= controllers(fresh_cgroup)
    assert [e.name for e in os.scandir(fresh_cgroup) if e.is_dir()] == [LEAF]


@pytest.fixture(scope="module")
def judge(sandbox_dir: str) -> Iterator[ProgramJudge]:
    j = ProgramJudge(settings=JudgeSettings(sandbox_dir=sandbox_dir), slots=2)
    assert j.isolation.mode == "full" and isinstance(j.roots, V2Roots)
    yield j
    j.close()


def make_box(directory: str, uid: int) -> None:
    """A box directory whose program sleeps a tenth of its input in seconds, then prints it."""
    os.mkdir(directory, 0o700)
    os.chown(directory, uid, uid)
    Path(directory, "main.py").write_text("import time\nn = int(input())\ntime.sleep(n / 10)\nprint(n)\n")
    os.chmod(os.path.join(directory, "main.py"), 0o644)


@pytest.fixture
async def lane(judge: ProgramJudge) -> AsyncIterator[tuple[Lane, tuple[BoxGroup, BoxGroup]]]:
    uid = judge.uid_base
    directory = os.path.join(judge.boxes_dir, "0")
    await asyncio.to_thread(make_box, directory, uid)
    assert judge.roots is not None
    named = f"{judge.group_prefix}0"
    groups = (box_group(judge.roots, f"{named}-a"), box_group(judge.roots, f"{named}-b"))
    runs = Lane(box=directory, uid=uid, isolation=judge.isolation, groups=groups, python=judge.tools["python3"])
    yield runs, groups
    await runs.close()
    await asyncio.to_thread(shutil.rmtree, directory)
    await assert_host_clean(judge)


async def test_each_test_of_a_session_runs_in_a_cgroup_of_its_own(
    lane: tuple[Lane, tuple[BoxGroup, BoxGroup]],
) -> None:
    runs, groups = lane
    argv = ["/usr/bin/python3", "-I", "-S", "-B", f"{BOX}/main.py"]
    limits = Limits(cpu=2.0, wall=10.0, memory=200 << 20, processes=7)
    first = await runs.run(argv, stdin=b"0", limits=limits, ahead=True)
    assert (first.stdout, runs.sessions) == (b"0\n", 1), first
    box = next(g for g in groups if g.leftover())
    assert isinstance(box, V2Group) and box.split
    seen: dict[str, object] = {}

    def the_test_is_running() -> bool:
        tests = [e.path for e in os.scandir(box.path) if e.is_dir() and e.name.startswith("test-")]
        if len(tests) != 1 or not procs(tests[0]):
            return False
        seen.update(
            test=tests[0], program=procs(tests[0]), runner=procs(os.path.join(box.path, RUNNER)),
            memory_max=Path(tests[0], "memory.max").read_text().strip(),
            pids_max=Path(tests[0], "pids.max").read_text().strip(),
            box_procs=procs(box.path), controllers=controllers(box.path),
        )  # fmt: skip
        return True

    running = asyncio.create_task(runs.run(argv, stdin=b"20", limits=limits, ahead=True))
    await eventually(the_test_is_running, within=20, what="the second test running in its own cgroup")
    second = await running
    assert second.stdout == b"20\n" and second.exit_code == 0, second
    assert seen["memory_max"] == str(200 << 20) and seen["pids_max"] == "7", seen  # the test's own limits
    assert len(seen["runner"]) == 2 and seen["box_procs"] == set(), seen  # type: ignore[arg-type]
    assert seen["controllers"] == {"memory", "pids"}, seen
    assert not await asyncio.to_thread(os.path.exists, str(seen["test"]))  # removed once the test was over
    assert runs.in_session == 2 and runs.sessions == 1
    # A test with other limits starts a new session (a new box); its tests get their own cgroups too.
    third = await runs.run(argv, stdin=b"1", limits=replace(limits, memory=100 << 20), ahead=False)
    assert third.stdout == b"1\n"


ROLE = "import sys, judgequeue.core.cli as cli; sys.exit(cli.main(sys.argv[1:]))"


def worker_env(sandbox_dir: str, **extra: str) -> dict[str, str]:
    return fail_closed_worker_env(sandbox_dir, "fail-closed-v2", **extra)


def read_only_cgroupfs(cgroup: str, argv: list[str]) -> list[str]:
    """``argv`` in ``cgroup``, in a mount namespace of its own where /sys/fs/cgroup is read-only (as
    in a container that is not given a writable one). A bind remount: the host's mount is untouched."""
    script = f'echo $$ > "$1/cgroup.procs" && mount -o remount,bind,ro {CGROUP} && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", cgroup, *argv]


def undelegated(cgroup: str) -> str:
    """A cgroup below ``cgroup`` to which no controller is handed down."""
    inner = os.path.join(cgroup, "w")
    os.mkdir(inner)
    assert controllers(inner, "cgroup.controllers") == set()
    return inner


@pytest.mark.parametrize(
    ("layout", "names"),
    [
        ("read-only", "cannot create {cgroup}/judgequeue-worker (Read-only file system): " + DELEGATE),
        ("undelegated", "the memory and pids controllers are not delegated to {cgroup}/w (its cgroup.controllers: "
                        "none): " + DELEGATE),
        ("root", f"the worker runs in the root cgroup ({CGROUP}), which cannot be its own: " + DELEGATE),
    ],
)  # fmt: skip
def test_a_worker_without_a_delegated_cgroup_fails_closed_in_one_line(
    fresh_cgroup: str, sandbox_dir: str, layout: str, names: str
) -> None:
    argv = [sys.executable, "-c", ROLE, "worker"]
    if layout == "read-only":
        command = read_only_cgroupfs(fresh_cgroup, argv)
    elif layout == "undelegated":
        command = in_cgroup(undelegated(fresh_cgroup), argv)
    else:
        command = in_cgroup(CGROUP, argv)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=worker_env(sandbox_dir), cwd="/")
    assert done.returncode == 2, (done.stdout, done.stderr)
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1, done.stderr  # one line, before any connection is tried
    assert errors[0].startswith("judgequeue: error: the program judge cannot isolate untrusted code on this worker: ")
    assert "cgroup v2: " + names.format(cgroup=fresh_cgroup) in errors[0], errors[0]
    assert "JUDGEQUEUE_SANDBOX=trusted" in errors[0] and "s3cr3t" not in done.stderr
    assert [e.name for e in os.scandir(fresh_cgroup) if e.is_dir()] == (["w"] if layout == "undelegated" else [])


def test_in_a_pod_a_worker_without_a_delegated_cgroup_stays_up_unready(fresh_cgroup: str, sandbox_dir: str) -> None:
    port = free_port()
    env = worker_env(
        sandbox_dir, JUDGEQUEUE_REDIS_URL=REDIS_URL, JUDGEQUEUE_METRICS_PORT=str(port),
        JUDGEQUEUE_METRICS_ADDRESS="127.0.0.1", JUDGEQUEUE_JUDGE_REFUSED="unready",
    )  # fmt: skip
    command = read_only_cgroupfs(fresh_cgroup, [sys.executable, "-c", ROLE, "worker"])
    proc = subprocess.Popen(command, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    try:
        wait_serving(proc, port, 60, "the unready worker to serve /healthz")
        status, body = http_get(port, "/readyz")
        reason = json.loads(body)["checks"]["judge"]
        assert status == 503 and reason.startswith("the program judge cannot isolate untrusted code"), body
        assert f"cgroup v2: cannot create {fresh_cgroup}/judgequeue-worker (Read-only file system)" in reason
        assert http_get(port, "/readyz")[0] == 503
    finally:
        code = stop_process(proc, 30)
        proc.communicate(timeout=30)
    assert code == 2
