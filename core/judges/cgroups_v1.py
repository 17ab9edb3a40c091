"""cgroup v1 accounting for the sandbox: one group per box in the memory, pids and cpuacct hierarchies.

Limits and facts cover the whole process tree of a box, not one process: memory (+swap) peak and
OOM kills, CPU time in nanoseconds, and the number of processes. Every box group lives under
``<worker's own group>/judgequeue-sandbox/<name>`` in each hierarchy, so the worker's own memory
limit (a pod's) still bounds all its boxes together.

A box that runs several tests measures each as differences over the test: CPU time and counters
read before and after, the memory peak reset at the start (v1 resets it on any write) and counted
over what the group held then.

Parsing is pure (:func:`find_v1_roots`, :func:`parse_oom_kills`); everything else touches
``/sys/fs/cgroup`` and is idempotent (a crashed worker's leftovers are removed by the next one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

from .cgroups_base import BoxGroup, PerTest, Roots, Usage, keyed, read, write

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


class V1Group(BoxGroup):
    """A box's groups in the three hierarchies."""

    def __init__(self, roots: V1Roots, name: str) -> None:
        self.name = name
        self.memory = os.path.join(roots.memory, name)
        self.pids = os.path.join(roots.pids, name)
        self.cpuacct = os.path.join(roots.cpuacct, name)

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
        for d in self.dirs():
            try:
                os.rmdir(d)
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True

    def create(self, *, memory: int, processes: int, split_tests: bool = False) -> None:
        # split_tests changes nothing here: a test is measured as differences (V1PerTest).
        for d in self.dirs():
            os.mkdir(d)
        write(os.path.join(self.memory, "memory.limit_in_bytes"), str(memory))
        memsw = os.path.join(self.memory, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):  # no swap on top of the limit where swap is accounted
            write(memsw, str(memory))
        write(os.path.join(self.pids, "pids.max"), str(processes))

    def usage(self) -> Usage:
        peak = os.path.join(self.memory, "memory.memsw.max_usage_in_bytes")
        if not os.path.exists(peak):
            peak = os.path.join(self.memory, "memory.max_usage_in_bytes")
        return Usage(
            cpu_ns=int(read(os.path.join(self.cpuacct, "cpuacct.usage"))),
            memory_peak=int(read(peak)),
            oom_kills=parse_oom_kills(read(os.path.join(self.memory, "memory.oom_control"))),
            pids_refused=keyed(read(os.path.join(self.pids, "pids.events"))).get("max", 0),
        )

    def memory_now(self) -> int:
        usage = os.path.join(self.memory, "memory.memsw.usage_in_bytes")
        if not os.path.exists(usage):
            usage = os.path.join(self.memory, "memory.usage_in_bytes")
        return int(read(usage))

    def reset_peak(self) -> None:
        """Start the peak over from what the group holds now (cgroup v1 resets it on any write)."""
        for name in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"):
            path = os.path.join(self.memory, name)
            if os.path.exists(path):
                write(path, "0")

    def set_memory(self, limit: int) -> None:
        """The kernel wants memory <= memory + swap at every step."""
        mem = os.path.join(self.memory, "memory.limit_in_bytes")
        memsw = os.path.join(self.memory, "memory.memsw.limit_in_bytes")
        if not os.path.exists(memsw):
            write(mem, str(limit))
            return
        first, second = (memsw, mem) if limit > int(read(mem)) else (mem, memsw)
        write(first, str(limit))
        write(second, str(limit))

    def cpu_ns(self) -> int:
        return int(read(os.path.join(self.cpuacct, "cpuacct.usage")))

    def pids_in(self, *, everywhere: bool = False) -> set[int]:
        """By the pids hierarchy (every run joins it), or in all three ``everywhere``."""
        found: set[int] = set()
        for f in self.procs_files() if everywhere else [os.path.join(self.pids, "cgroup.procs")]:
            with contextlib.suppress(FileNotFoundError):
                found.update(int(p) for p in read(f).split())
        return found

    def kill_all(self, deadline: float) -> bool:
        """Repeats because a process may fork between the read and the kill; ``pids.max`` bounds
        how many it can make."""
        while True:
            pids = self.pids_in(everywhere=True)
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)  # let the kernel finish the exits before the next read

    def destroy(self, deadline: float) -> bool:
        if not any(os.path.isdir(d) for d in self.dirs()):
            return True
        self.kill_all(deadline)
        gone = True
        for d in self.dirs():
            while os.path.isdir(d):
                try:
                    os.rmdir(d)
                except OSError:
                    if time.monotonic() > deadline:
                        gone = False
                        break
                    time.sleep(0.001)  # exiting tasks leave the group a moment after SIGKILL
        return gone

    def per_test(self, *, memory: int, processes: int) -> PerTest:
        return V1PerTest(self)


class V1PerTest(PerTest):
    """One test of a box, measured on the box's own groups: differences over the test, the memory
    peak reset at its start and counted over what the group held then (the box runner's own)."""

    def __init__(self, group: V1Group) -> None:
        self.group = group
        self.before = group.usage()
        group.reset_peak()
        self.held = group.memory_now()

    def cpu_ns(self) -> int:
        return self.group.cpu_ns() - self.before.cpu_ns

    def usage(self) -> Usage:
        after = self.group.usage()
        return Usage(
            cpu_ns=after.cpu_ns - self.before.cpu_ns,
            memory_peak=max(0, after.memory_peak - self.held),
            oom_kills=after.oom_kills - self.before.oom_kills,
            pids_refused=after.pids_refused - self.before.pids_refused,
        )

    def close(self, deadline: float) -> bool:
        return True  # nothing of its own: the box's groups live on
