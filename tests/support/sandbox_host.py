"""What a sandbox test checks on the host after a run: nothing of any box is left behind."""

from __future__ import annotations

import asyncio
import glob
import os
import re

from judgequeue.core.judges.program import ProgramJudge
from tests.support.waiting import eventually

SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
#: How many times slower than a native CPU the machine running the sandbox tests is: the cgroup v2
#: VM (tests/vm) emulates its CPU and sets it. CPU limits a program's own start has to fit under,
#: and bounds on the CPU time a run reports, are multiplied by it.
CPU_SCALE = float(os.environ.get("JUDGEQUEUE_TEST_CPU_SCALE", "1"))


def box_uids(judge: ProgramJudge) -> range:
    return range(judge.uid_base, judge.uid_base + judge.slots)


#: The cgroups of a program judge's box: ``<tag of host and sandbox dir>-<uid range>-<slot>``, and
#: the same with ``-a``/``-b`` (a run's two groups), ``-ca``/``-cb`` (its checker's) or ``-h`` (a helper build).
BOX_GROUP = re.compile(r"^[0-9a-f]{8}-[0-9]+-[0-9]+(-[a-z]+)?$")


def in_another_judges_box(pid: int, prefix: str) -> bool:
    """True when ``pid`` runs in the box group of a judge other than the one whose groups start with
    ``prefix``. Uid ranges are unique per sandbox directory, not per host, so tests running at once
    (pytest-xdist workers, each with its own directory) use the same box uids; their groups tell
    them apart. A process in no box group is counted as anyone's."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            paths = [line.rstrip("\n").split(":", 2)[-1] for line in f]
    except OSError:
        return False
    names = [name for path in paths for name in path.split("/") if BOX_GROUP.match(name)]
    return bool(names) and not any(name.startswith(prefix) for name in names)


def processes_of(uids: range, judge_prefix: str | None = None) -> list[int]:
    """Live (not zombie) processes whose real uid is in ``uids`` (with ``judge_prefix``: less those
    in another judge's box group)."""
    found = []
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        if int(fields.get("Uid", "-1 0").split()[0]) in uids and not fields.get("State", "").strip().startswith("Z"):
            pid = int(status.split("/")[2])
            if judge_prefix is None or not in_another_judges_box(pid, judge_prefix):
                found.append(pid)
    return found


def files_of(uids: range, dirs: tuple[str, ...] = SCRATCH_DIRS) -> list[str]:
    found = []
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid in uids:
                    found.append(entry.path)
            except OSError:
                continue
    return found


def ipc_objects_of(uids: range) -> list[str]:
    """SysV shared memory, semaphores and message queues owned by a box uid (host IPC namespace)."""
    found = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()
        except OSError:
            continue
        header = rows[0].split()
        for row in rows[1:]:
            cols = dict(zip(header, row.split(), strict=False))
            if int(cols.get("uid", -1)) in uids:
                found.append(f"{kind}:{cols.get('key')}")
    return found


def box_leftovers(judge: ProgramJudge) -> list[str]:
    left = [os.path.join(judge.boxes_dir, n) for n in os.listdir(judge.boxes_dir)]
    if judge.roots is not None:
        for root in judge.roots.all():
            left += [os.path.join(root, n) for n in os.listdir(root) if n.startswith(judge.group_prefix)]
    return left


async def assert_host_clean(judge: ProgramJudge) -> None:
    """No process, box directory, cgroup, file or IPC object of any box of ``judge`` is left."""
    uids = box_uids(judge)

    async def no_processes() -> bool:
        await asyncio.sleep(0)
        return not processes_of(uids, judge.group_prefix)

    await eventually(no_processes, within=5, what=f"no process of uids {uids.start}-{uids.stop - 1}")
    assert box_leftovers(judge) == []
    assert files_of(uids) == []
    assert ipc_objects_of(uids) == []


def fail_closed_worker_env(sandbox_dir: str, queue: str, **extra: str) -> dict[str, str]:
    """The environment of a program-judge worker that must refuse before it talks to anyone: its
    Postgres and Redis are unreachable, and the DSN holds a password (``s3cr3t``) that no refusal may
    print."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "JUDGEQUEUE_POSTGRES_DSN": "postgresql://judge:s3cr3t@127.0.0.1:1/none",
        "JUDGEQUEUE_REDIS_URL": "redis://127.0.0.1:1/0",
        "JUDGEQUEUE_QUEUE": queue,
        "JUDGEQUEUE_JUDGE": "program",
        "JUDGEQUEUE_METRICS_PORT": "0",
        "JUDGEQUEUE_SANDBOX_DIR": sandbox_dir,
        **extra,
    }
