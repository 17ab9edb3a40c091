"""Run one untrusted command in a box: bubblewrap for isolation, cgroups for whole-tree limits.

A run (``isolation.mode == "full"``, see docs/judges.md for the threat model):

* joins a fresh cgroup first (v1: memory/pids/cpuacct; v2: one; a two-line ``sh`` shim, as root), so every
  process it will ever make is limited and accounted together: memory + swap, process count, CPU
  time in nanoseconds (the worker kills the box when it reaches the limit);
* sets the per-process limits the kernel has no group form of: file size, stack, open files, no
  core files;
* drops to the box's own uid (one per slot, no groups, no capabilities, ``no_new_privs``) and
  runs bubblewrap, which makes new user, PID, IPC, network, mount, UTS and cgroup namespaces, a
  read-only root of bind mounts of the runtime's directories only, a size-capped tmpfs ``/tmp``,
  only ``/dev/null``, ``/dev/zero`` and ``/dev/urandom``, an empty environment, a new session;
  it forbids nested user namespaces and loads the seccomp allow-list of :mod:`.seccomp`;
* reads stdin from a memfd (the box cannot block the worker), stdout and stderr through pipes the
  worker drains without blocking, and learns of the exit through a pidfd, so no wait depends on
  what the box does with its file descriptors. Every wait has a deadline.

A run is started in two steps: :func:`arm` starts the process chain, which joins its groups and
has bubblewrap build the namespaces and mounts, then waits on ``--block-fd``; :func:`run` fills
its stdin and lets it go. Cold runs do both at once; :class:`~.lane.Lane` arms a submission's next
test while the current one runs. Once the program is done, the namespace's init (held by a pidfd
from before the go, so its pid cannot be reused) is killed, taking anything the box left with it;
a worker that is its container's PID 1 also reaps it (:func:`_reap_orphaned_init`).

``trusted`` mode (only with ``JUDGEQUEUE_SANDBOX=trusted``): the command runs directly with the
same rlimits plus ``RLIMIT_AS``/``RLIMIT_CPU``, in its own session killed as a whole; CPU and
memory come from ``wait4``'s rusage of the direct child only. It isolates nothing.

The command lines are pure functions; :func:`run` is the only I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .cgroups import BoxGroup
from .command import (
    REAP_GRACE,
    Isolation,
    KilledFor,
    Limits,
    RunFacts,
    build_command,
    engine_child_pid,
    engine_exit_code,
)
from .watch import Pipe, WallGuard, next_check


@dataclass
class Armed:
    """A run started ahead of its time (see :class:`~.lane.Lane`).

    Its process has joined its cgroups and bubblewrap has made the namespaces and mounts; it waits
    on ``--block-fd`` until :func:`run` fills its stdin and lets it go. It belongs to whoever holds
    it: :func:`run` consumes it, :func:`discard` kills it.
    """

    proc: subprocess.Popen[bytes]
    fit: tuple[object, ...]  # what it was started for (:func:`run_fit`)
    group: BoxGroup | None
    stdin_fd: int  # the memfd filled at go; -1 when the run reads a pipe it was given
    out_r: int  # -1 when stdout goes to a pipe the run was given
    err_r: int
    status_r: int
    go_w: int  # -1 once gone (and always in trusted mode, which does not wait)
    report: bytes = b""  # what bubblewrap said on its status descriptor, once read
    init_fd: int = -1  # pidfd of the namespace's init, opened while the monitor still holds it


def run_fit(argv: Sequence[str], *, box: str, uid: int, limits: Limits, writable_box: bool) -> tuple[object, ...]:
    """Everything an armed process is fixed to (pure): a run may use it only when all of this matches.
    CPU, wall and output limits are not among them: the worker enforces those from outside."""
    shaped = (limits.memory, limits.processes, limits.file_size, limits.stack, limits.open_files, limits.scratch)
    return (tuple(argv), box, uid, writable_box, shaped)


async def arm(
    argv: Sequence[str],
    *,
    box: str,
    uid: int,
    limits: Limits,
    isolation: Isolation,
    group: BoxGroup | None,
    writable_box: bool = False,
    stdin: bytes | None = None,
    stdin_fd: int | None = None,
    stdout_fd: int | None = None,
    keep_fd: int | None = None,
    memory: int | None = None,
    processes: int | None = None,
) -> Armed:
    """Start a run's process up to the point where only the program's exec is left.

    ``stdin`` given here is written before the process starts (trusted mode starts at once);
    otherwise :func:`run` writes it at go. ``stdin_fd``/``stdout_fd`` are owned from here on.
    ``keep_fd`` (the box runner's channel, full mode only) is passed to the command under its own
    number, which then runs as the namespace's init, in a group made for tests of their own
    (:meth:`~.cgroups.BoxGroup.per_test`); ``memory`` and ``processes`` replace the group's limits.
    """
    full = isolation.mode == "full"
    if full:
        assert group is not None
        # A few small writes to cgroupfs (well under a millisecond): not worth a thread hop.
        if group.leftover():
            await asyncio.to_thread(group.destroy, time.monotonic() + REAP_GRACE)
        group.create(
            memory=memory or limits.memory, processes=processes or limits.processes, split_tests=keep_fd is not None
        )
    own_stdin = stdin_fd is None
    opened: list[int] = []
    try:
        if stdin_fd is None:
            stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
            if stdin:
                fill_stdin(stdin_fd, stdin)
        opened.append(stdin_fd)
        if stdout_fd is None:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            opened += [out_r, out_w]
        else:
            out_r, out_w = -1, stdout_fd
            opened.append(stdout_fd)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        seccomp_fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
        opened += [err_r, err_w, status_r, status_w, seccomp_fd]
        go_r, go_w = os.pipe2(os.O_CLOEXEC) if full else (-1, -1)
        opened += [go_r, go_w] if full else []
        os.write(seccomp_fd, isolation.seccomp)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        command = build_command(
            argv, box=box, uid=uid, limits=limits, isolation=isolation, writable_box=writable_box,
            procs_files=group.procs_files() if full and group else [], seccomp_fd=seccomp_fd, status_fd=status_w,
            block_fd=go_r if full else None, as_pid_1=keep_fd is not None,
        )  # fmt: skip
        passed = (seccomp_fd, status_w, go_r) if full else (seccomp_fd, status_w)
        # Popen forks with vfork and returns once the shim has exec'd: no wait on the box itself.
        proc = subprocess.Popen(  # noqa: ASYNC220
            command, stdin=stdin_fd, stdout=out_w, stderr=err_w, env={}, close_fds=True, start_new_session=True,
            pass_fds=passed if keep_fd is None else (*passed, keep_fd), cwd=box if not full else "/",
        )  # fmt: skip
    except BaseException:
        for fd in opened:
            os.close(fd)
        if full and group is not None:
            group.try_remove()
        raise
    # The box has its own descriptors now. A memfd of ours stays open until go: it may still be filled.
    for fd in (out_w, err_w, status_w, seccomp_fd, go_r, -1 if own_stdin else stdin_fd):
        if fd >= 0:
            os.close(fd)
    fit = run_fit(argv, box=box, uid=uid, limits=limits, writable_box=writable_box)
    return Armed(proc, fit, group if full else None, stdin_fd if own_stdin else -1, out_r, err_r, status_r, go_w)


def fill_stdin(fd: int, data: bytes) -> None:
    """Write a run's whole stdin into its memfd and rewind it (the box shares the offset)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)


async def discard(armed: Armed) -> None:
    """Kill an armed run that will not be used, and remove what it had."""
    await _finish(armed)


async def run(
    argv: Sequence[str],
    *,
    box: str,
    uid: int,
    stdin: bytes,
    limits: Limits,
    isolation: Isolation,
    group: BoxGroup | None,
    writable_box: bool = False,
    parallelism: int | None = None,
    stdin_fd: int | None = None,
    stdout_fd: int | None = None,
    armed: Armed | None = None,
    on_start: Callable[[], object] | None = None,
) -> RunFacts:
    """Run ``argv`` in the box and report the facts. Cancellation kills the whole run first.

    ``stdin_fd``/``stdout_fd`` (interactive problems) connect the run to pipes instead of the
    ``stdin`` bytes and the captured stdout; the run owns them: they are closed once the box has
    them (or when the run fails before that), so the other end sees EOF when the box is gone.
    Its facts then have no stdout and no output limit is enforced on that pipe.

    ``armed`` is this run's process started ahead (:func:`arm`, same ``argv``, box and limits);
    it is consumed either way. ``on_start`` is called once the program is let go.
    """
    full = isolation.mode == "full"
    if armed is None:
        armed = await arm(
            argv, box=box, uid=uid, limits=limits, isolation=isolation, group=group, writable_box=writable_box,
            stdin=stdin if stdin_fd is None else None, stdin_fd=stdin_fd, stdout_fd=stdout_fd,
        )  # fmt: skip
    else:
        assert armed.fit == run_fit(argv, box=box, uid=uid, limits=limits, writable_box=writable_box)
        if stdin and armed.stdin_fd >= 0:
            fill_stdin(armed.stdin_fd, stdin)
    try:
        return await _watch(armed, limits, full, parallelism or os.cpu_count() or 1, on_start)
    finally:
        await _finish(armed)


async def _watch(
    armed: Armed, limits: Limits, full: bool, parallelism: int, on_start: Callable[[], object] | None
) -> RunFacts:
    """Let an armed run go and follow it to its end under the limits."""
    loop = asyncio.get_running_loop()
    proc, group = armed.proc, armed.group
    killed_for: KilledFor | None = None
    pidfd = os.pidfd_open(proc.pid)
    exited = asyncio.Event()

    ended = 0.0

    def on_exit() -> None:
        nonlocal ended
        ended = time.monotonic()  # which side of an interaction ended first decides some verdicts
        # A pidfd stays readable once the process has exited: a reader left in place would
        # wake the loop on every iteration (a busy loop while the box is emptied and drained).
        loop.remove_reader(pidfd)
        exited.set()

    def kill(reason: KilledFor) -> None:
        nonlocal killed_for
        if killed_for is None:
            killed_for = reason
        _kill_run(proc, group)

    pipes: list[Pipe] = []
    try:
        loop.add_reader(pidfd, on_exit)
        out = Pipe(loop, armed.out_r, limits.output, on_over=lambda: kill("output")) if armed.out_r >= 0 else None
        err = Pipe(loop, armed.err_r, limits.stderr)
        status = Pipe(loop, armed.status_r, 4096)
        armed.out_r = armed.err_r = armed.status_r = -1
        pipes = [p for p in (out, err, status) if p is not None]
        if full:
            await _hold_init(armed, status, exited)
        started = time.monotonic()
        let_go(armed)
        if on_start is not None:
            on_start()
        guard = WallGuard(limits.wall, started, group.pids_in if group else lambda: {proc.pid})
        await _until_exit(exited, group, guard, limits, full, parallelism, kill)
        # The main process ended (or was killed): nothing of the box may outlive it.
        if group is not None:
            await _empty(armed, group)
        else:
            _kill_run(proc, None)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(exited.wait(), REAP_GRACE)
        stuck = not exited.is_set()
        wall = time.monotonic() - started
        # The pidfd said it exited, so this reaps at once (WNOHANG when it is stuck).
        _, wait_status, rusage = os.wait4(proc.pid, os.WNOHANG if stuck else 0)  # noqa: ASYNC222
        if not stuck:
            proc.returncode = 0  # reaped here; keeps Popen from waiting on it again
        # Every writer is dead now; what is left in the pipes is bounded by their buffers.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.eof.wait() for p in pipes)), REAP_GRACE)
        stdout = bytes(out.data[: limits.output]) if out else b""
        armed.report = bytes(status.data)
        facts = RunFacts(
            exit_code=None, signal=None, stdout=stdout, stderr=bytes(err.data), wall=wall, cpu=0.0, memory_peak=0,
            oom_killed=False, killed_for=killed_for, stuck=stuck, waited=guard.waited, ended=ended,
        )  # fmt: skip
        return _measured(facts, armed.report, group, wait_status, rusage)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        for p in pipes:
            p.close()


async def _until_exit(
    exited: asyncio.Event, group: BoxGroup | None, guard: WallGuard, limits: Limits, full: bool, parallelism: int,
    kill: Callable[[KilledFor], None],
) -> None:  # fmt: skip
    """Wait for the run's main process to exit, killing the run at its CPU limit (the group's
    counter, full isolation only) or when its wall guard says so."""
    while not exited.is_set():
        now = time.monotonic()
        cpu = group.cpu_ns() / 1e9 if group else 0.0
        if full and cpu >= limits.cpu:
            kill("cpu")
            return
        if guard.over(now):
            kill("wall")
            return
        wall_left_now = guard.deadline - now
        wait = next_check(limits.cpu - cpu, wall_left_now, parallelism) if full else wall_left_now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(exited.wait(), wait)


def _measured(
    facts: RunFacts, report: bytes, group: BoxGroup | None, wait_status: int, rusage: resource.struct_rusage
) -> RunFacts:
    """A finished run's facts with what it used: from its group and the engine's exit report, or
    (trusted mode, no group) from ``wait4`` on its direct child."""
    if group is not None:
        usage = group.usage()  # four small reads
        return replace(
            facts, exit_code=engine_exit_code(report), cpu=usage.cpu_ns / 1e9, memory_peak=usage.memory_peak,
            oom_killed=usage.oom_kills > 0, processes_refused=usage.pids_refused,
        )  # fmt: skip
    return replace(
        facts,
        exit_code=os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None,
        signal=os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None,
        cpu=rusage.ru_utime + rusage.ru_stime,
        memory_peak=rusage.ru_maxrss * 1024,
    )


async def _hold_init(armed: Armed, status: Pipe, exited: asyncio.Event) -> None:
    """Open a pidfd of the namespace's init before the program runs.

    bubblewrap reports the init's pid right after creating it, and its monitor holds it until the
    run is over, so the pid cannot have been reused yet. Waiting costs nothing: the program could
    not start before bubblewrap's setup anyway. An engine that fails first leaves no init.
    """
    deadline = time.monotonic() + REAP_GRACE
    while (pid := engine_child_pid(bytes(status.data))) is None:
        if exited.is_set() or status.eof.is_set() or time.monotonic() > deadline:
            return
        status.grew.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(status.grew.wait(), max(0.0, deadline - time.monotonic()))
    with contextlib.suppress(ProcessLookupError):
        armed.init_fd = os.pidfd_open(pid)


async def _empty(armed: Armed, group: BoxGroup) -> None:
    """Leave nothing of the box behind once its program is done.

    The monitor exits as soon as the init has reported the program's status; the init then waits
    for whatever else the box started. It is killed at once (the kernel takes every process of
    its PID namespace with it) and its exit awaited without a thread; only what is then still in
    the box's groups (an engine that failed half-way) is killed one by one.
    """
    if armed.init_fd >= 0:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(armed.init_fd, signal.SIGKILL)
        await _exited(armed.init_fd, REAP_GRACE)
    if group.pids_in():
        await asyncio.to_thread(group.kill_all, time.monotonic() + REAP_GRACE)


async def _exited(pidfd: int, within: float) -> bool:
    """Wait until the process behind ``pidfd`` has exited, at most ``within`` seconds."""
    loop = asyncio.get_running_loop()
    gone = asyncio.Event()
    loop.add_reader(pidfd, gone.set)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gone.wait(), within)
    finally:
        loop.remove_reader(pidfd)
    return gone.is_set()


def let_go(armed: Armed) -> None:
    """Let an armed run exec its program (bubblewrap reads one byte from its ``--block-fd``)."""
    if armed.stdin_fd >= 0:
        os.close(armed.stdin_fd)  # the box holds its own descriptor of the filled memfd
        armed.stdin_fd = -1
    if armed.go_w >= 0:
        # A process that died while armed has closed its end: the watch then sees it gone.
        with contextlib.suppress(BrokenPipeError):
            os.write(armed.go_w, b"g")
        os.close(armed.go_w)
        armed.go_w = -1


async def _finish(armed: Armed) -> None:
    """After a run (or instead of one): kill whatever of it is left, reap it, close its descriptors
    and remove its groups. An armed process is killed before its go pipe closes: bubblewrap would
    take the end of file for a go."""
    proc, group = armed.proc, armed.group
    if proc.returncode is None:  # cancelled, failed half-way, or never let go
        _kill_run(proc, group)
        if group is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.to_thread(group.kill_all, time.monotonic() + REAP_GRACE))
        # Killed above: its exit is a matter of moments, and reaping it leaves no zombie behind.
        await asyncio.shield(_reap(proc, REAP_GRACE))
    if armed.status_r >= 0:  # never watched: what bubblewrap wrote before it was killed
        with contextlib.suppress(OSError):
            os.set_blocking(armed.status_r, False)
            armed.report += os.read(armed.status_r, 4096)
    for name in ("stdin_fd", "out_r", "err_r", "status_r", "go_w", "init_fd"):
        fd = getattr(armed, name)
        if fd >= 0:
            os.close(fd)
            setattr(armed, name, -1)
    await _reap_orphaned_init(armed.report)
    # Something still leaving the groups is waited for in a thread.
    if group is not None and not group.try_remove():
        await asyncio.shield(asyncio.to_thread(group.destroy, time.monotonic() + REAP_GRACE))


async def _reap(proc: subprocess.Popen[bytes], within: float) -> None:
    """Reap a killed child once it exited; after ``within`` seconds leave it (it is then stuck in
    the kernel: better a zombie than a worker that hangs)."""
    await _reap_pid(proc.pid, within)
    proc.returncode = -1  # reaped or given up on: Popen must never wait on it


async def _reap_pid(pid: int, within: float) -> bool:
    """Wait (through a pidfd, at most ``within`` seconds) until child ``pid`` exits and reap it.
    False when it is not this process's child (any more) or did not exit in time."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):  # noqa: ASYNC222 (never blocks)
            return True
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        try:
            await _exited(pidfd, within)
        finally:
            os.close(pidfd)
        return os.waitpid(pid, os.WNOHANG) != (0, 0)  # noqa: ASYNC222 (never blocks)
    return False


async def _reap_orphaned_init(report: bytes) -> None:
    """Reap the box's namespace init when it was left to this process.

    bubblewrap's monitor exits as soon as its init reports the program's status, without waiting
    for the init itself, which is then re-parented to the nearest subreaper or init: the worker
    when it is a container's PID 1 (the image's entry point). Nobody else would reap it there, and
    every test would leave one zombie holding a pid of the pod's limit. Elsewhere that init or
    subreaper reaps it and there is nothing to do (and nothing safe: the pid is not ours).
    """
    pid = engine_child_pid(report)
    if pid is not None and reaps_orphans():
        await _reap_pid(pid, REAP_GRACE)


def reaps_orphans() -> bool:
    """Whether orphaned descendants of this process are re-parented to it: when it is its PID
    namespace's init (a container's entry point). The worker never makes itself a subreaper."""
    return os.getpid() == 1


def _kill_run(proc: subprocess.Popen[bytes] | None, group: BoxGroup | None) -> None:
    """SIGKILL the run's session (the engine's monitor, which takes the PID namespace with it)
    and, when there is one, every process in its cgroup."""
    if proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if group is not None:
        for pid in group.pids_in(everywhere=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
