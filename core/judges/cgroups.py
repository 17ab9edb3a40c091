"""cgroup v1 accounting for the sandbox: one group per run in the memory, pids and cpuacct hierarchies.

Limits and facts cover the whole process tree of a run, not one process: memory (+swap) peak and
OOM kills, CPU time in nanoseconds, and the number of processes. Every box group lives under
``<worker's own group>/judgequeue-sandbox/<range>-<slot>`` in each hierarchy, so the worker's own
memory limit (a pod's) still bounds all its boxes together.

Parsing is pure (:func:`find_roots`, :func:`parse_oom_kills`); everything else touches
``/sys/fs/cgroup`` and is written to be idempotent (a crashed worker's leftovers are removed by
the next one through :func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

CONTROLLERS = ("memory", "pids", "cpuacct")
PARENT = "judgequeue-sandbox"


@dataclass(frozen=True)
class Roots:
    """The directory under which box groups are made, per controller."""

    memory: str
    pids: str
    cpuacct: str

    def all(self) -> tuple[str, str, str]:
        return (self.memory, self.pids, self.cpuacct)


def find_roots(mounts: str, self_cgroup: str) -> Roots | str:
    """Where this process's cgroup v1 groups are, from ``/proc/self/mounts`` and ``/proc/self/cgroup``.

    Returns the roots, or a sentence naming what is missing (pure).
    """
    mount_of: dict[str, str] = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup":
            for opt in fields[3].split(","):
                if opt in CONTROLLERS:
                    mount_of.setdefault(opt, fields[1])
    group_of: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(","):
                group_of[name] = parts[2]
    missing = [c for c in CONTROLLERS if c not in mount_of]
    if missing:
        return f"cgroup v1 controllers {', '.join(missing)} are not mounted (cgroup v2 is not supported yet)"
    roots = []
    for c in CONTROLLERS:
        group = group_of.get(c, "/").lstrip("/")
        roots.append(os.path.join(mount_of[c], group, PARENT))
    return Roots(*roots)


def parse_oom_kills(oom_control: str) -> int:
    """The ``oom_kill`` counter of ``memory.oom_control`` (pure; 0 on kernels without it)."""
    for line in oom_control.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


@dataclass(frozen=True)
class Usage:
    """What a box used, over all its processes."""

    cpu_ns: int
    memory_peak: int
    oom_kills: int
    pids_refused: int  # forks refused by pids.max


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def prepare(roots: Roots) -> None:
    """Create the parent groups (idempotent); raises OSError when this process may not."""
    for root in roots.all():
        os.makedirs(root, exist_ok=True)
    # Children of the memory parent are accounted hierarchically (the default on current kernels).
    with contextlib.suppress(OSError):
        _write(os.path.join(roots.memory, "memory.use_hierarchy"), "1")


class BoxGroup:
    """The groups of one run: created with limits, read for facts, emptied and removed."""

    def __init__(self, roots: Roots, name: str) -> None:
        self.name = name
        self.memory = os.path.join(roots.memory, name)
        self.pids = os.path.join(roots.pids, name)
        self.cpuacct = os.path.join(roots.cpuacct, name)

    def dirs(self) -> tuple[str, str, str]:
        return (self.memory, self.pids, self.cpuacct)

    def procs_files(self) -> list[str]:
        """The files a process writes its pid into to join the box (all three hierarchies)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs()]

    def leftover(self) -> bool:
        """Whether any of the groups exists (a run that could not be cleaned up)."""
        return any(os.path.isdir(d) for d in self.dirs())

    def try_remove(self) -> bool:
        """Remove the groups if they are empty, without waiting; True when none is left."""
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

    def create(self, *, memory: int, processes: int) -> None:
        """Fresh groups with the memory (+swap) and process limits (the caller removes leftovers:
        :meth:`leftover`, :meth:`destroy`)."""
        for d in self.dirs():
            os.mkdir(d)
        _write(os.path.join(self.memory, "memory.limit_in_bytes"), str(memory))
        memsw = os.path.join(self.memory, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):  # no swap on top of the limit where swap is accounted
            _write(memsw, str(memory))
        _write(os.path.join(self.pids, "pids.max"), str(processes))

    def usage(self) -> Usage:
        peak = os.path.join(self.memory, "memory.memsw.max_usage_in_bytes")
        if not os.path.exists(peak):
            peak = os.path.join(self.memory, "memory.max_usage_in_bytes")
        refused = 0
        for line in _read(os.path.join(self.pids, "pids.events")).splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                refused = int(value)
        return Usage(
            cpu_ns=int(_read(os.path.join(self.cpuacct, "cpuacct.usage"))),
            memory_peak=int(_read(peak)),
            oom_kills=parse_oom_kills(_read(os.path.join(self.memory, "memory.oom_control"))),
            pids_refused=refused,
        )

    def memory_now(self) -> int:
        """Memory (+ swap where accounted) the group holds now."""
        usage = os.path.join(self.memory, "memory.memsw.usage_in_bytes")
        if not os.path.exists(usage):
            usage = os.path.join(self.memory, "memory.usage_in_bytes")
        return int(_read(usage))

    def reset_peak(self) -> None:
        """Start the peak over from what the group holds now (cgroup v1 resets it on any write)."""
        for name in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"):
            path = os.path.join(self.memory, name)
            if os.path.exists(path):
                _write(path, "0")

    def set_memory(self, limit: int) -> None:
        """Change the memory (+ swap) limit; the kernel wants memory <= memory + swap at every step."""
        mem = os.path.join(self.memory, "memory.limit_in_bytes")
        memsw = os.path.join(self.memory, "memory.memsw.limit_in_bytes")
        if not os.path.exists(memsw):
            _write(mem, str(limit))
            return
        first, second = (memsw, mem) if limit > int(_read(mem)) else (mem, memsw)
        _write(first, str(limit))
        _write(second, str(limit))

    def cpu_ns(self) -> int:
        return int(_read(os.path.join(self.cpuacct, "cpuacct.usage")))

    def pids_in(self, *, everywhere: bool = False) -> set[int]:
        """Processes in the box: by the pids hierarchy (every run joins it), or ``everywhere``, for a
        process stopped half-way through joining (cleanup after a crash)."""
        found: set[int] = set()
        for f in self.procs_files() if everywhere else [os.path.join(self.pids, "cgroup.procs")]:
            with contextlib.suppress(FileNotFoundError):
                found.update(int(p) for p in _read(f).split())
        return found

    def kill_all(self, deadline: float) -> bool:
        """SIGKILL every process in the box until none is left or ``deadline``; True when empty.

        Repeats because a process may fork between the read and the kill; ``pids.max`` bounds how
        many it can make.
        """
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
        """Kill what is left and remove the groups; True when all are gone."""
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


def remove_stale(roots: Roots, prefix: str, deadline: float) -> list[str]:
    """Remove every box group whose name starts with ``prefix`` (a crashed worker's); their names."""
    names: set[str] = set()
    for root in roots.all():
        with contextlib.suppress(FileNotFoundError):
            names.update(n for n in os.listdir(root) if n.startswith(prefix) and os.path.isdir(os.path.join(root, n)))
    for name in names:
        BoxGroup(roots, name).destroy(deadline)
    return sorted(names)


def read_roots() -> Roots | str:
    """:func:`find_roots` for this process."""
    try:
        return find_roots(_read("/proc/self/mounts"), _read("/proc/self/cgroup"))
    except OSError as exc:
        return f"cannot read the cgroup mounts: {exc}"


def memory_controllers_usable(roots: Roots) -> str | None:
    """None when box groups can be made here, else why not (tries one)."""
    try:
        prepare(roots)
        probe = BoxGroup(roots, f"probe-{os.getpid()}")
        probe.destroy(time.monotonic() + 5)  # a crashed process's of the same pid
        probe.create(memory=64 << 20, processes=4)
        probe.destroy(time.monotonic() + 5)
    except OSError as exc:
        return f"cannot create cgroups under {roots.memory} ({exc.strerror})"
    return None


def all_gone(groups: Iterable[BoxGroup]) -> bool:
    return not any(os.path.isdir(d) for g in groups for d in g.dirs())
