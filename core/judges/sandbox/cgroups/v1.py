"""cgroup v1 accounting for the sandbox: one group per box in the memory, pids and cpuacct hierarchies.

Limits and facts cover the whole process tree of a box, not one process: memory (+swap) peak and
OOM kills, CPU time in nanoseconds, and the number of processes. Every box group lives under
``<worker's own group>/judgequeue-sandbox/<name>`` in each hierarchy, so the worker's own memory
limit (a pod's) still bounds all its boxes together.

A box that runs several tests (:mod:`.session`) gives each test a fresh child of the box's memory
group, ``<box>/test-<n>``, with the test's own memory (+swap) limit, which the program joins before
its exec (:attr:`V1PerTest.join_fd`, as on cgroup v2): the test's memory peak and OOM kills are
read from that group alone, and an OOM kill can only hit the test's processes, never the box's
runner. CPU time and refused forks stay differences over the test on the box's cpuacct and pids
groups: those counters are exact, so the program joins only the memory hierarchy.

Parsing is pure (:func:`find_v1_roots`, :func:`parse_oom_kills`); everything else touches
``/sys/fs/cgroup`` and is idempotent (a crashed worker's leftovers are removed by the next one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from .base import BoxGroup, PerTest, Roots, Usage, keyed, procs, procs_below, read, remove_tree, write

CONTROLLERS = ("memory", "pids", "cpuacct")
PARENT = "judgequeue-sandbox"


@dataclass(frozen=True)
class V1Roots(Roots):
    """The directory under which box groups are made, per controller."""

    memory: str
    pids: str
    cpuacct: str

    version = 1

    def all(self) -> tuple[str, str, str]:
        return (self.memory, self.pids, self.cpuacct)

    def usable(self) -> str | None:
        try:
            prepare(self)
            probe = V1Group(self, f"probe-{os.getpid()}")
            probe.destroy(time.monotonic() + 5)  # a crashed process's of the same pid
            probe.create(memory=64 << 20, processes=4)
            probe.destroy(time.monotonic() + 5)
        except OSError as exc:
            return f"cannot create cgroups under {self.memory} ({exc.strerror})"
        return None


def v1_mounts(mounts: str) -> dict[str, str]:
    """Where each v1 controller this sandbox uses is mounted, from ``/proc/self/mounts`` (pure)."""
    mount_of: dict[str, str] = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup":
            for opt in fields[3].split(","):
                if opt in CONTROLLERS:
                    mount_of.setdefault(opt, fields[1])
    return mount_of


def find_v1_roots(mount_of: dict[str, str], self_cgroup: str) -> V1Roots:
    """The box parents under this process's own v1 groups (pure; every controller is mounted)."""
    group_of: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(","):
                group_of[name] = parts[2]
    roots = []
    for c in CONTROLLERS:
        group = group_of.get(c, "/").lstrip("/")
        roots.append(os.path.join(mount_of[c], group, PARENT))
    return V1Roots(*roots)


def parse_oom_kills(oom_control: str) -> int:
    """The ``oom_kill`` counter of ``memory.oom_control`` (pure; 0 on kernels without it)."""
    return keyed(oom_control).get("oom_kill", 0)


def prepare(roots: V1Roots) -> None:
    """Create the parent groups (idempotent); raises OSError when this process may not."""
    for root in roots.all():
        os.makedirs(root, exist_ok=True)
    # Children of the memory parent are accounted hierarchically (the default on current kernels).
    with contextlib.suppress(OSError):
        write(os.path.join(roots.memory, "memory.use_hierarchy"), "1")


def _peak(memory_dir: str) -> int:
    """A memory group's peak, memory + swap where swap is accounted."""
    peak = os.path.join(memory_dir, "memory.memsw.max_usage_in_bytes")
    if not os.path.exists(peak):
        peak = os.path.join(memory_dir, "memory.max_usage_in_bytes")
    return int(read(peak))


def _limit_memory(memory_dir: str, limit: int) -> None:
    """The memory limit of a fresh group, and memory + swap at the same value where swap is
    accounted (both start unlimited, and the kernel wants memory <= memory + swap at every step)."""
    write(os.path.join(memory_dir, "memory.limit_in_bytes"), str(limit))
    memsw = os.path.join(memory_dir, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):  # no swap on top of the limit where swap is accounted
        write(memsw, str(limit))


def _kill_until_empty(find: Callable[[], set[int]], deadline: float) -> bool:
    """SIGKILL what ``find`` names until it names none (True) or ``deadline`` passes (False). It
    repeats because a process may fork between the read and the kill (v1 has no ``cgroup.kill``);
    ``pids.max`` bounds how many it can make."""
    while pids := find():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)  # let the kernel finish the exits before the next read
    return True


class V1Group(BoxGroup):
    """A box's groups in the three hierarchies (and, split for tests, one memory child per test)."""

    def __init__(self, roots: V1Roots, name: str) -> None:
        self.name = name
        self.memory = os.path.join(roots.memory, name)
        self.pids = os.path.join(roots.pids, name)
        self.cpuacct = os.path.join(roots.cpuacct, name)
        self.split = False
        self.tests = 0

    def dirs(self) -> tuple[str, str, str]:
        return (self.memory, self.pids, self.cpuacct)

    def procs_files(self) -> list[str]:
        """All three hierarchies' (a process joins each)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs()]

    def leftover(self) -> bool:
        return any(os.path.isdir(d) for d in self.dirs())

    def try_remove(self) -> bool:
        if self.pids_in():
            return False
        return all(remove_tree(d, None) for d in self.dirs())

    def create(self, *, memory: int, processes: int, split_tests: bool = False) -> None:
        for d in self.dirs():
            os.mkdir(d)
        self.split = split_tests  # a test's memory group is made in the box's by per_test
        _limit_memory(self.memory, memory)
        write(os.path.join(self.pids, "pids.max"), str(processes))

    def usage(self) -> Usage:
        return Usage(
            cpu_ns=self.cpu_ns(),
            memory_peak=_peak(self.memory),
            oom_kills=parse_oom_kills(read(os.path.join(self.memory, "memory.oom_control"))),
            pids_refused=self.pids_refused(),
        )

    def cpu_ns(self) -> int:
        return int(read(os.path.join(self.cpuacct, "cpuacct.usage")))

    def pids_refused(self) -> int:
        return keyed(read(os.path.join(self.pids, "pids.events"))).get("max", 0)

    def pids_in(self, *, everywhere: bool = False) -> set[int]:
        """By the pids hierarchy (every run joins it), or in every group of the box ``everywhere``
        (a test's memory group included)."""
        if not everywhere:
            return procs(self.pids)
        return set().union(*(procs_below(d) for d in self.dirs()))

    def kill_all(self, deadline: float) -> bool:
        return _kill_until_empty(lambda: self.pids_in(everywhere=True), deadline)

    def destroy(self, deadline: float) -> bool:
        if not any(os.path.isdir(d) for d in self.dirs()):
            return True
        self.kill_all(deadline)
        return all([remove_tree(d, deadline) for d in self.dirs()])  # a list: every one is tried

    def per_test(self, *, memory: int, processes: int) -> PerTest:
        """A fresh memory group in the box's for the test (``processes`` is the box's own limit,
        counted over the test by the pids group)."""
        if not self.split:
            raise ValueError(f"{self.memory} was not made for tests of their own (split_tests)")
        self.tests += 1
        return V1PerTest(self, os.path.join(self.memory, f"test-{self.tests}"), memory)


class V1PerTest(PerTest):
    """One test of a split box: its own memory group (the test's limit, a fresh peak and OOM
    counter), which the program joins through :attr:`join_fd` (the group's ``tasks``) before its
    exec; CPU time and refused forks as differences over the test on the box's groups."""

    def __init__(self, group: V1Group, path: str, memory: int) -> None:
        self.group = group
        self.path = path
        self.cpu_before = group.cpu_ns()
        self.refused_before = group.pids_refused()
        os.mkdir(path)
        try:
            _limit_memory(path, memory)
            # ``tasks``, not ``cgroup.procs``: the program joins before its exec, while its process
            # is one thread (the runner's fork), and the kernel moves a writer's own thread without
            # the global lock a process move takes, which waits for an RCU grace period (~10 ms
            # measured here) whenever no move came just before.
            self.join_fd = os.open(os.path.join(path, "tasks"), os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            remove_tree(path, None)
            raise

    def cpu_ns(self) -> int:
        return self.group.cpu_ns() - self.cpu_before

    def usage(self) -> Usage:
        return Usage(
            cpu_ns=self.cpu_ns(),
            memory_peak=_peak(self.path),
            oom_kills=parse_oom_kills(read(os.path.join(self.path, "memory.oom_control"))),
            pids_refused=self.group.pids_refused() - self.refused_before,
        )

    def close(self, deadline: float) -> bool:
        if self.join_fd >= 0:
            os.close(self.join_fd)
            self.join_fd = -1
        # The runner reaped the test's processes: normally there are none to kill.
        if not _kill_until_empty(lambda: procs(self.path), deadline):
            return False
        return remove_tree(self.path, deadline)
