"""Watching a boxed run from outside: when to look at its CPU counter again, the wall guard that
allows for a loaded machine, and the pipes drained without blocking the worker."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

POLL_MAX = 0.05  # longest pause between CPU checks; shorter when the limit is near
#: However long a run waited for a CPU, the wall guard stops it at this many times its wall limit.
STARVED_WALL_FACTOR = 4.0


def next_check(cpu_left: float, wall_left: float, parallelism: int) -> float:
    """How long to wait before looking at the CPU counter again (pure).

    The box cannot burn more than ``parallelism`` CPU-seconds per second, so waiting
    ``cpu_left / parallelism`` cannot miss the limit by more than one poll; never longer than
    :data:`POLL_MAX`, never past the wall deadline, never a busy loop.
    """
    return max(0.001, min(POLL_MAX, cpu_left / max(1, parallelism), wall_left))


def wall_left(elapsed: float, waited: float, limit: float) -> float:
    """Seconds before the wall guard stops a run (pure; <= 0: now).

    The guard is for a program that sleeps or waits forever (IDLENESS_LIMIT), so it counts wall time
    less the time the run was ready to run but the machine gave it no CPU: on a loaded worker a
    program that spins would otherwise be stopped for idleness before it used its CPU time. However
    it was spent, a run is stopped at :data:`STARVED_WALL_FACTOR` times the limit.
    """
    return min(limit - (elapsed - waited), limit * STARVED_WALL_FACTOR - elapsed)


def task_delays(pids: set[int]) -> dict[int, int]:
    """Nanoseconds each thread of ``pids`` has been runnable without a CPU (the second field of
    ``/proc/PID/task/TID/schedstat``); threads gone meanwhile are left out."""
    delays: dict[int, int] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    delays[int(tid)] = int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return delays


class WallGuard:
    """The wall guard of one run (see :func:`wall_left`): free while the run is within its limit,
    then reads how long the run's tasks waited for a CPU each time the limit seems passed."""

    def __init__(self, limit: float, started: float, pids: Callable[[], set[int]]) -> None:
        self.limit = limit
        self.started = started
        self.deadline = started + limit
        self.pids = pids
        self.before = task_delays(pids())  # a box runner's own past waits are not the run's
        self.waited = 0.0

    def over(self, now: float) -> bool:
        """Whether the run is to be stopped for its wall time (moves the deadline when it waited)."""
        if now < self.deadline:
            return False
        delays = task_delays(self.pids())
        waited = max((d - self.before.get(tid, 0) for tid, d in delays.items()), default=0) / 1e9
        self.waited = max(self.waited, waited)
        left = wall_left(now - self.started, self.waited, self.limit)
        if left <= 0:
            return True
        self.deadline = now + left
        return False


def read_ready(fd: int) -> bytes | None:
    """One read of a non-blocking pipe end the event loop said is readable: None when nothing is there
    after all, b"" at end of file or when the pipe broke (nothing more will come either way)."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


class Pipe:
    """One non-blocking pipe read end drained by the event loop into a capped buffer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, cap: int, on_over: object = None) -> None:
        self.loop = loop
        self.fd = fd
        self.cap = cap
        self.data = bytearray()
        self.total = 0
        self.eof = asyncio.Event()
        self.grew = asyncio.Event()  # set on every read (cleared by whoever waits for more)
        self.on_over = on_over
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        chunk = read_ready(self.fd)
        if chunk is None:
            return
        if not chunk:
            self.close()
            return
        self.grew.set()
        self.total += len(chunk)
        room = self.cap + 1 - len(self.data)  # one byte over the cap proves the cap was passed
        if room > 0:
            self.data.extend(chunk[:room])
        if self.total > self.cap and callable(self.on_over):
            self.on_over()

    def close(self) -> None:
        if not self.eof.is_set():
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.eof.set()
            self.grew.set()
