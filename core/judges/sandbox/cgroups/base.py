"""What every cgroup backend of the sandbox offers (:mod:`.v1`, :mod:`.v2`).

A box's group is made with its limits, joined by the box's first process (through the files
:meth:`BoxGroup.procs_files` names), read for the facts of a run (:class:`Usage`), emptied and
removed. The factory :func:`~judgequeue.core.judges.sandbox.cgroups.box_group` makes the group of
the backend the roots belong to, so callers never name a hierarchy version. A submission's box that
runs several tests (:mod:`..session`) gives each test a group of its own with
:meth:`BoxGroup.per_test`, which the test's program joins and whose facts are that test's alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Usage:
    """What a box (or one test in it) used, over all its processes."""

    cpu_ns: int
    memory_peak: int
    oom_kills: int
    pids_refused: int  # forks refused by pids.max


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def below(path: str) -> list[str]:
    """``path`` and every group below it, deepest first (removal order)."""
    return [top for top, _, _ in os.walk(path)][::-1]


def procs(path: str) -> set[int]:
    """The processes in the group ``path`` itself (``cgroup.procs``); none once it is gone."""
    with contextlib.suppress(FileNotFoundError):
        return {int(p) for p in read(os.path.join(path, "cgroup.procs")).split()}
    return set()


def procs_below(path: str) -> set[int]:
    """The processes in ``path`` and every group below it."""
    found: set[int] = set()
    for group in below(path):
        found |= procs(group)
    return found


def remove_tree(path: str, deadline: float | None) -> bool:
    """rmdir ``path`` and the groups below it, deepest first; without a deadline, one try. Both
    hierarchy versions remove a box's groups this way (v1 once per controller)."""
    for d in below(path):
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                if deadline is None or time.monotonic() > deadline:
                    return False
                time.sleep(0.001)  # a killed process leaves its group a moment after it is reaped
    return not os.path.isdir(path)


def keyed(text: str) -> dict[str, int]:
    """``key value`` lines of a cgroup file (``memory.events``, ``cpu.stat``, ``pids.events``,
    v1's ``memory.oom_control``) as integers; lines that are not are left out (pure)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = int(value)
        except ValueError:
            continue
    return values


class Roots(ABC):
    """Where this worker makes its box groups, and which backend makes them."""

    version: ClassVar[int]

    @abstractmethod
    def all(self) -> tuple[str, ...]:
        """The directories box groups are made in (one per hierarchy)."""

    @abstractmethod
    def usable(self) -> str | None:
        """Make this worker's part of the tree ready for box groups and try one; None when it works,
        else one sentence naming what is missing."""


class PerTest(ABC):
    """The accounting of one test in a box that runs several: its facts are that test's alone."""

    #: A descriptor of the file that joins the test's own group (v2 ``cgroup.procs``, v1 ``tasks``),
    #: opened for writing by the worker, for the box's runner to hand to the program, which writes
    #: itself into it before its exec (-1 once closed).
    join_fd: int = -1

    @abstractmethod
    def cpu_ns(self) -> int:
        """CPU time of the test so far."""

    @abstractmethod
    def usage(self) -> Usage:
        """The test's facts (call once its processes are gone)."""

    @abstractmethod
    def close(self, deadline: float) -> bool:
        """Release what the test had; True when nothing of it is left."""


class BoxGroup:
    """The group(s) of one box: created with limits, read for facts, emptied and removed.

    Each backend has its own kind (:class:`~.v1.V1Group`, :class:`~.v2.V2Group`), made by
    :func:`~judgequeue.core.judges.sandbox.cgroups.box_group` for the roots at hand.
    """

    name: str

    def dirs(self) -> tuple[str, ...]:
        """The group's top directories (one per hierarchy)."""
        raise NotImplementedError

    def procs_files(self) -> list[str]:
        """The files a process writes its pid into to join the box."""
        raise NotImplementedError

    def leftover(self) -> bool:
        """Whether any of the group exists (a run that could not be cleaned up)."""
        raise NotImplementedError

    def try_remove(self) -> bool:
        """Remove the group if it is empty, without waiting; True when none is left."""
        raise NotImplementedError

    def create(self, *, memory: int, processes: int, split_tests: bool = False) -> None:
        """A fresh group with the memory (+swap) and process limits. ``split_tests``: the box runs
        several tests, each measured by :meth:`per_test` (the caller removes leftovers first:
        :meth:`leftover`, :meth:`destroy`)."""
        raise NotImplementedError

    def usage(self) -> Usage:
        raise NotImplementedError

    def cpu_ns(self) -> int:
        raise NotImplementedError

    def pids_in(self, *, everywhere: bool = False) -> set[int]:
        """Processes in the box; ``everywhere`` also finds one stopped half-way through joining
        (cleanup after a crash)."""
        raise NotImplementedError

    def kill_all(self, deadline: float) -> bool:
        """SIGKILL every process in the box until none is left or ``deadline``; True when empty."""
        raise NotImplementedError

    def destroy(self, deadline: float) -> bool:
        """Kill what is left and remove the group; True when all of it is gone."""
        raise NotImplementedError

    def per_test(self, *, memory: int, processes: int) -> PerTest:
        """Start measuring one test of a box made with ``split_tests``: a fresh group of the test's
        own with its memory limit (and its process limit, where the backend gives a test its own),
        for its program to join (:attr:`PerTest.join_fd`)."""
        raise NotImplementedError
