"""One box for all of a submission's tests: started once, the program run in it per test by a runner.

Starting a boxed run costs more CPU than a short test program itself: the ``sh`` shim, ``setpriv``,
bubblewrap's namespaces and mounts, cgroup creation and removal (~8 ms a test on a 2-CPU VM). A
submission's tests run the same command in the same box with the same limits, so a :class:`Session`
starts the box once with :mod:`.box_runner` as the namespace's init, and each test is one message:
the runner spawns the program on the test's stdin memfd and output pipes, waits, kills and reaps
everything else in the namespace, empties ``/tmp`` and reports the raw wait status.

What stays the worker's, as for a cold run: the CPU and wall limits (it kills the program's
processes, never the runner's), the output cap, and every accounting fact of the test alone
(:meth:`~.cgroups.BoxGroup.per_test`). Each test has a fresh group of its own in the box with the
test's memory limit (cgroup v2: its process limit too; cgroup v1: a memory group, CPU time and
refused forks counted as differences over the test on the box's groups): the worker sends the
runner a descriptor of the file that joins that group with the test's, and the program writes
itself into it before its exec (the runner answers ``unjoined`` when it could not: the test then
runs in a box of its own). The box's own limits are the test's plus room for the runner.

A session that is not provably clean after a test (the runner said so, a process other than the
runner is left, the runner is gone or late) is *broken*: the caller discards it and starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .cgroups import BoxGroup, PerTest
from .command import REAP_GRACE, Isolation, KilledFor, Limits, RunFacts, engine_child_pid
from .run import Armed, arm, discard, fill_stdin, let_go, run_fit
from .watch import Pipe, WallGuard, next_check

RUNNER_SOURCE = Path(__file__).with_name("box_runner.py").read_text()
RUNNER_ROOM = 64 * 1024 * 1024  # the box's memory beside a test's own limit: the runner's
RUNNER_PROCESSES = 2  # bubblewrap's monitor and the runner, beside a test's own
START_WITHIN = 10.0  # seconds for a box and its runner to come up
KILL_EVERY = 0.01  # seconds between kills of a program that keeps forking while it is stopped


def runner_argv(python: str, channel_fd: int, argv: Sequence[str]) -> list[str]:
    """The box's command: the runner, its channel's descriptor number, then the program (pure)."""
    return [python, "-I", "-S", "-B", "-c", RUNNER_SOURCE, str(channel_fd), *argv]


def parse_done(message: bytes) -> tuple[int, bool] | None:
    """``(wait status, clean)`` from the runner's ``done`` message; None for anything else (pure)."""
    parts = message.split()
    if len(parts) != 3 or parts[0] != b"done" or parts[2] not in (b"0", b"1"):
        return None
    try:
        return int(parts[1]), parts[2] == b"1"
    except ValueError:
        return None


def exit_facts(status: int | None) -> tuple[int | None, int | None]:
    """``(exit code, signal)`` of a raw wait status (pure): a signal n is also exit code 128 + n,
    as bubblewrap reports it for cold runs."""
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


@dataclass
class _Stop:
    """Why a test's program is being killed (its output, CPU or wall limit) and since when: set by
    the output pipe's callback and by the watch, whichever is first."""

    reason: KilledFor | None = None
    at: float = 0.0


class SessionBroken(Exception):
    """The box could not be started, or is not clean after a test: it must not be used again."""


class Session:
    """A started box and its runner (see the module's docstring). Use :func:`start` to make one."""

    def __init__(self, armed: Armed, channel: socket.socket, runner_pid: int, status: Pipe, errors: Pipe) -> None:
        self.armed = armed
        self.fit = armed.fit
        self.group = armed.group
        self.channel = channel
        self.runner_pid = runner_pid
        self.status = status
        self.errors = errors  # the runner's own stderr (diagnostics)
        self.broken = False
        self._replies: asyncio.Queue[bytes] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        channel.setblocking(False)
        loop.add_reader(channel.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            message = self.channel.recv(256)
        except BlockingIOError:
            return
        except OSError:
            message = b""
        if not message:
            asyncio.get_running_loop().remove_reader(self.channel.fileno())
        self._replies.put_nowait(message)

    async def _reply(self, within: float) -> bytes:
        """The runner's next message; b"" when it is gone or silent past ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self._replies.get(), max(0.0, within))
        return b""

    def _others(self) -> set[int]:
        """The box's processes other than bubblewrap's monitor and the runner: the program's."""
        assert self.group is not None
        return self.group.pids_in() - {self.armed.proc.pid, self.runner_pid}

    def _kill_program(self) -> None:
        for pid in self._others():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def run(self, stdin: bytes, limits: Limits, parallelism: int) -> RunFacts:
        """Run the program on one test; facts as a cold run reports them. Raises SessionBroken
        (after marking the session broken) when the box cannot be trusted for this test."""
        if self.broken:
            raise SessionBroken("the session is broken")
        group = self.group
        assert group is not None
        loop = asyncio.get_running_loop()
        fds: list[int] = []
        pipes: list[Pipe] = []
        stop = _Stop()
        test: PerTest | None = None
        try:
            stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
            fds.append(stdin_fd)
            fill_stdin(stdin_fd, stdin)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            fds += [out_r, out_w]
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            fds += [err_r, err_w]
            try:
                test = group.per_test(memory=limits.memory, processes=limits.processes)
            except OSError as exc:
                raise SessionBroken(f"cannot make the test's cgroup: {exc}") from None

            def over() -> None:
                stop.reason = stop.reason or "output"
                stop.at = stop.at or time.monotonic()
                self._kill_program()

            out = Pipe(loop, out_r, limits.output, on_over=over)
            err = Pipe(loop, err_r, limits.stderr)
            pipes = [out, err]
            fds = [stdin_fd, out_w, err_w]
            given = [stdin_fd, out_w, err_w, test.join_fd]
            started = time.monotonic()
            try:
                socket.send_fds(self.channel, [b"run"], given)
            except OSError as exc:
                raise SessionBroken(f"the runner is gone: {exc}") from None
            for fd in fds:
                os.close(fd)
            fds = []
            guard = WallGuard(limits.wall, started, group.pids_in)
            reply = await self._report(test, guard, limits, parallelism, stop)
            wall = time.monotonic() - started
            if reply == b"unjoined":  # the program never ran
                raise SessionBroken("the program could not join its test's cgroup")
            done = parse_done(reply) if reply else None
            # Every writer is dead once the runner reports; what is left is bounded by the buffers.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(p.eof.wait() for p in pipes)), REAP_GRACE)
            used = test.usage()
            if done is None or not done[1] or self._others():
                self.broken = True
            code, sig = exit_facts(done[0] if done else None)
            return RunFacts(
                exit_code=code, signal=sig, stdout=bytes(out.data[: limits.output]), stderr=bytes(err.data),
                wall=wall, cpu=used.cpu_ns / 1e9, memory_peak=used.memory_peak, oom_killed=used.oom_kills > 0,
                killed_for=stop.reason, processes_refused=used.pids_refused, stuck=reply is None and stop.at > 0,
                waited=guard.waited,
            )  # fmt: skip
        except BaseException:
            self.broken = True
            raise
        finally:
            for fd in fds:
                os.close(fd)
            for p in pipes:
                p.close()
            # One try, no wait: the runner reaped the test's processes before it reported; a test
            # whose group is not gone at once leaves a broken box (its removal then waits).
            if test is not None and not test.close(time.monotonic()):
                self.broken = True

    async def _report(
        self, test: PerTest, guard: WallGuard, limits: Limits, parallelism: int, stop: _Stop
    ) -> bytes | None:
        """The runner's report of the test, watching the test's CPU time and wall guard meanwhile;
        None when a killed program's box did not report within :data:`REAP_GRACE`."""
        reply: bytes | None = None
        while reply is None:
            now = time.monotonic()
            cpu = test.cpu_ns() / 1e9
            if stop.reason is None and (cpu >= limits.cpu or guard.over(now)):
                stop.reason = "cpu" if cpu >= limits.cpu else "wall"
            if stop.reason is not None:
                # Until the runner reports: a program may fork between a read of the group and a kill.
                stop.at = stop.at or now
                self._kill_program()
                if now > stop.at + REAP_GRACE:
                    break
                wait = KILL_EVERY
            else:
                wait = next_check(limits.cpu - cpu, guard.deadline - now, parallelism)
            with contextlib.suppress(TimeoutError):
                reply = await asyncio.wait_for(self._replies.get(), wait)
        return reply

    async def close(self) -> None:
        """Kill the box and remove its groups (whatever state it is in)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            loop.remove_reader(self.channel.fileno())
        self.channel.close()
        self.armed.report = bytes(self.status.data)
        self.status.close()
        self.errors.close()
        await discard(self.armed)


async def start(
    python: str,
    argv: Sequence[str],
    *,
    box: str,
    uid: int,
    limits: Limits,
    isolation: Isolation,
    group: BoxGroup,
) -> Session:
    """Start a box whose runner will run ``argv`` per test; SessionBroken when it does not come up."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        armed = await arm(
            runner_argv(python, theirs.fileno(), argv), box=box, uid=uid, limits=limits, isolation=isolation,
            group=group, keep_fd=theirs.fileno(), memory=limits.memory + RUNNER_ROOM,
            processes=limits.processes + RUNNER_PROCESSES,
        )  # fmt: skip
    except BaseException:
        ours.close()
        theirs.close()
        raise
    theirs.close()
    armed.fit = run_fit(argv, box=box, uid=uid, limits=limits, writable_box=False)
    status = Pipe(loop, armed.status_r, 4096)
    errors = Pipe(loop, armed.err_r, 4096)
    armed.status_r = armed.err_r = -1
    with contextlib.suppress(OSError):
        os.close(armed.out_r)
    armed.out_r = -1
    session: Session | None = None
    try:
        let_go(armed)  # bubblewrap execs the runner
        session = Session(armed, ours, 0, status, errors)
        deadline = time.monotonic() + START_WITHIN
        while (pid := engine_child_pid(bytes(status.data))) is None:
            if status.eof.is_set() or time.monotonic() > deadline:
                raise SessionBroken("bubblewrap did not start the runner")
            status.grew.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(status.grew.wait(), max(0.0, deadline - time.monotonic()))
        session.runner_pid = pid
        ready = await session._reply(deadline - time.monotonic())
        if ready != b"ready":
            why = bytes(errors.data).decode(errors="replace").strip()[-300:]
            raise SessionBroken(f"the box runner did not start: {why or 'no message'}")
        return session
    except BaseException:
        if session is not None:
            session.broken = True
            await session.close()
        else:
            ours.close()
            status.close()
            errors.close()
            await discard(armed)
        raise
