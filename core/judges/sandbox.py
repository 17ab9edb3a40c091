"""Run one untrusted command in a box: bubblewrap for isolation, cgroup v1 for whole-tree limits.

A run (``isolation.mode == "full"``, see docs/judges.md for the threat model):

* joins fresh memory/pids/cpuacct cgroups first (a two-line ``sh`` shim, as root), so every
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

``trusted`` mode (only with ``JUDGEQUEUE_SANDBOX=trusted``): the command runs directly with the
same rlimits plus ``RLIMIT_AS``/``RLIMIT_CPU``, in its own session killed as a whole; CPU and
memory come from ``wait4``'s rusage of the direct child only. It isolates nothing.

The command lines are pure functions; :func:`run` is the only I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .cgroups import BoxGroup

Mode = Literal["full", "trusted"]
KilledFor = Literal["cpu", "wall", "output"]
BOX = "/box"  # where the box directory appears inside the sandbox
SCRATCH = "/tmp"
PATH = "/usr/local/bin:/usr/bin:/bin"
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
POLL_MAX = 0.05  # longest pause between CPU checks; shorter when the limit is near
REAP_GRACE = 5.0  # how long a killed box may take to disappear before the run is reported stuck


@dataclass(frozen=True)
class Limits:
    """Limits of one run. ``cpu`` and ``wall`` in seconds, sizes in bytes.

    ``cpu`` is CPU time over every process of the run; ``wall`` a separate guard for programs that
    sleep or block; ``memory`` is the run's memory + swap (cgroup), ``processes`` its process and
    thread count (cgroup); the rest are per-process rlimits.
    """

    cpu: float = 2.0
    wall: float = 5.0
    memory: int = 256 * 1024 * 1024
    output: int = 1024 * 1024
    file_size: int = 16 * 1024 * 1024
    stack: int = 64 * 1024 * 1024
    processes: int = 16
    open_files: int = 64
    scratch: int = 16 * 1024 * 1024  # size of /tmp inside the box
    stderr: int = 64 * 1024  # stderr kept for diagnostics; the rest is read and dropped


@dataclass(frozen=True)
class RunFacts:
    """What is known about how a run ended; the verdict is decided from these alone."""

    exit_code: int | None  # the engine's report (bubblewrap folds a signal n into 128 + n); None: no report
    signal: int | None  # only where it is known for certain (trusted mode's direct child)
    stdout: bytes
    stderr: bytes
    wall: float
    cpu: float  # seconds, all processes of the run
    memory_peak: int  # bytes
    oom_killed: bool
    killed_for: KilledFor | None = None
    processes_refused: int = 0
    stuck: bool = False  # the box did not disappear within REAP_GRACE after being killed


@dataclass(frozen=True)
class Isolation:
    """How runs are isolated on this worker (decided once, see :mod:`.capabilities`)."""

    mode: Mode
    bwrap: str = ""
    setpriv: str = ""
    ro_paths: tuple[str, ...] = ()  # directories bound read-only
    symlinks: tuple[tuple[str, str], ...] = ()  # (target, link) e.g. ("usr/lib", "/lib")
    seccomp: bytes = b""
    extra: tuple[str, ...] = field(default=())


def _ulimits(limits: Limits, extra: Sequence[tuple[str, int]] = ()) -> str:
    """``ulimit`` lines (dash takes one resource per call; an unknown flag fails the run)."""
    pairs = [
        ("-c", 0), ("-f", math.ceil(limits.file_size / 512)), ("-s", limits.stack // 1024), ("-n", limits.open_files),
        *extra,
    ]  # fmt: skip
    return "".join(f"ulimit {flag} {value} || exit 125\n" for flag, value in pairs)


def shim_script(limits: Limits, groups: int) -> str:
    """The ``sh`` program that joins the cgroups given as its first ``groups`` arguments,
    sets the rlimits, and execs the rest (pure; only integers are interpolated)."""
    joins = "".join(f'echo $$ > "${i + 1}" || exit 125\n' for i in range(groups))
    return joins + _ulimits(limits) + f"shift {groups}\n" + 'exec "$@"\n'


def trusted_shim_script(limits: Limits) -> str:
    """Trusted mode's shim: the same rlimits plus address space and CPU seconds (pure)."""
    cpu = max(1, math.ceil(limits.cpu)) + 1  # the worker's own wall check comes first
    return _ulimits(limits, [("-v", limits.memory // 1024), ("-t", cpu)]) + 'exec "$@"\n'


def bwrap_args(
    isolation: Isolation, *, box: str, writable_box: bool, limits: Limits, seccomp_fd: int, status_fd: int
) -> list[str]:
    """bubblewrap's options for one run (pure)."""
    args = [
        isolation.bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        "--cap-drop", "ALL", "--hostname", "box", "--clearenv", "--setenv", "PATH", PATH,
    ]  # fmt: skip
    for path in isolation.ro_paths:
        args += ["--ro-bind", path, path]
    for target, link in isolation.symlinks:
        args += ["--symlink", target, link]
    # Three device nodes, not bubblewrap's --dev (a whole devtmpfs with ptys: about 7 ms more per run).
    for node in DEVICES:
        args += ["--dev-bind", node, node]
    args += ["--size", str(limits.scratch), "--tmpfs", SCRATCH]
    args += ["--bind" if writable_box else "--ro-bind", box, BOX]
    args += ["--remount-ro", "/"]  # bubblewrap's own root is a tmpfs; only /tmp (and /box) stay writable
    args += ["--chdir", BOX if writable_box else SCRATCH, "--setenv", "TMPDIR", SCRATCH]
    args += ["--seccomp", str(seccomp_fd), "--json-status-fd", str(status_fd)]
    return args


def build_command(
    argv: Sequence[str],
    *,
    box: str,
    uid: int,
    limits: Limits,
    isolation: Isolation,
    procs_files: Sequence[str],
    writable_box: bool,
    seccomp_fd: int = 3,
    status_fd: int = 4,
) -> list[str]:
    """The whole command line of one run (pure)."""
    if isolation.mode == "trusted":
        return ["/bin/sh", "-c", trusted_shim_script(limits), "shim", *argv]
    drop = [
        isolation.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip
    engine = bwrap_args(
        isolation, box=box, writable_box=writable_box, limits=limits, seccomp_fd=seccomp_fd, status_fd=status_fd
    )
    return ["/bin/sh", "-c", shim_script(limits, len(procs_files)), "shim", *procs_files, *drop, *engine, "--", *argv]


def engine_exit_code(status_report: bytes) -> int | None:
    """The exit code bubblewrap reported on its ``--json-status-fd`` (pure); None without one."""
    code = None
    for line in status_report.decode("utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and isinstance(doc.get("exit-code"), int):
                code = doc["exit-code"]
    return code


def next_check(cpu_left: float, wall_left: float, parallelism: int) -> float:
    """How long to wait before looking at the CPU counter again (pure).

    The box cannot burn more than ``parallelism`` CPU-seconds per second, so waiting
    ``cpu_left / parallelism`` cannot miss the limit by more than one poll; never longer than
    :data:`POLL_MAX`, never past the wall deadline, never a busy loop.
    """
    return max(0.001, min(POLL_MAX, cpu_left / max(1, parallelism), wall_left))


class _Pipe:
    """One non-blocking pipe read end drained by the event loop into a capped buffer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, cap: int, on_over: object = None) -> None:
        self.loop = loop
        self.fd = fd
        self.cap = cap
        self.data = bytearray()
        self.total = 0
        self.eof = asyncio.Event()
        self.on_over = on_over
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
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
) -> RunFacts:
    """Run ``argv`` in the box and report the facts. Cancellation kills the whole run first.

    ``stdin_fd``/``stdout_fd`` (interactive problems) connect the run to pipes instead of the
    ``stdin`` bytes and the captured stdout; the run owns them: they are closed once the box has
    them (or when the run fails before that), so the other end sees EOF when the box is gone.
    Its facts then have no stdout and no output limit is enforced on that pipe.
    """
    loop = asyncio.get_running_loop()
    parallelism = parallelism or os.cpu_count() or 1
    full = isolation.mode == "full"
    if full:
        assert group is not None
        # A few small writes to cgroupfs (well under a millisecond): not worth a thread hop.
        if group.leftover():
            await asyncio.to_thread(group.destroy, time.monotonic() + REAP_GRACE)
        group.create(memory=limits.memory, processes=limits.processes)
    given_stdin = stdin_fd is not None
    if stdin_fd is None:
        stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    if stdout_fd is None:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
    else:
        out_r, out_w = -1, stdout_fd
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    seccomp_fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    killed_for: KilledFor | None = None
    proc: subprocess.Popen[bytes] | None = None
    pidfd = -1
    pipes: list[_Pipe] = []
    started = time.monotonic()
    try:
        if not given_stdin:
            os.write(stdin_fd, stdin)
            os.lseek(stdin_fd, 0, os.SEEK_SET)
        os.write(seccomp_fd, isolation.seccomp)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        command = build_command(
            argv, box=box, uid=uid, limits=limits, isolation=isolation, writable_box=writable_box,
            procs_files=group.procs_files() if full and group else [], seccomp_fd=seccomp_fd, status_fd=status_w,
        )  # fmt: skip
        # Popen forks with vfork and returns once the shim has exec'd: no wait on the box itself.
        proc = subprocess.Popen(  # noqa: ASYNC220
            command, stdin=stdin_fd, stdout=out_w, stderr=err_w, pass_fds=(seccomp_fd, status_w), env={},
            cwd=box if not full else "/", close_fds=True, start_new_session=True,
        )  # fmt: skip
        started = time.monotonic()
        pidfd = os.pidfd_open(proc.pid)
        for fd in (out_w, err_w, status_w, stdin_fd, seccomp_fd):
            os.close(fd)
        out_w = err_w = status_w = stdin_fd = seccomp_fd = -1

        def kill(reason: KilledFor) -> None:
            nonlocal killed_for
            if killed_for is None:
                killed_for = reason
            _kill_run(proc, group if full else None)

        exited = asyncio.Event()

        def on_exit() -> None:
            # A pidfd stays readable once the process has exited: a reader left in place would
            # wake the loop on every iteration (a busy loop while the box is emptied and drained).
            loop.remove_reader(pidfd)
            exited.set()

        loop.add_reader(pidfd, on_exit)
        out = _Pipe(loop, out_r, limits.output, on_over=lambda: kill("output")) if out_r >= 0 else None
        err = _Pipe(loop, err_r, limits.stderr)
        pipes = [err] if out is None else [out, err]
        status = _Pipe(loop, status_r, 4096)
        pipes.append(status)
        out_r = err_r = status_r = -1

        wall_deadline = started + limits.wall
        while not exited.is_set():
            now = time.monotonic()
            cpu = group.cpu_ns() / 1e9 if full and group else 0.0
            if full and cpu >= limits.cpu:
                kill("cpu")
                break
            if now >= wall_deadline:
                kill("wall")
                break
            wait = next_check(limits.cpu - cpu, wall_deadline - now, parallelism) if full else wall_deadline - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(exited.wait(), wait)
        # The main process ended (or was killed): nothing of the box may outlive it.
        if full and group is not None:
            if group.pids_in():  # usually empty already: bubblewrap's init took the namespace down
                await asyncio.to_thread(group.kill_all, time.monotonic() + REAP_GRACE)
        else:
            _kill_run(proc, None)
        stuck = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(exited.wait(), REAP_GRACE)
        if not exited.is_set():
            stuck = True
        wall = time.monotonic() - started
        # The pidfd said it exited, so this reaps at once (WNOHANG when it is stuck).
        _, wait_status, rusage = os.wait4(proc.pid, 0 if exited.is_set() else os.WNOHANG)  # noqa: ASYNC222
        proc.returncode = 0  # reaped here; keeps Popen from waiting on it again
        # Every writer is dead now; what is left in the pipes is bounded by their buffers.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.eof.wait() for p in pipes)), REAP_GRACE)
        stdout = bytes(out.data[: limits.output]) if out else b""
        if full and group is not None:
            usage = group.usage()  # four small reads
            exit_code = engine_exit_code(bytes(status.data))
            return RunFacts(
                exit_code=exit_code, signal=None, stdout=stdout, stderr=bytes(err.data),
                wall=wall, cpu=usage.cpu_ns / 1e9, memory_peak=usage.memory_peak, oom_killed=usage.oom_kills > 0,
                killed_for=killed_for, processes_refused=usage.pids_refused, stuck=stuck,
            )  # fmt: skip
        sig = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
        code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None
        return RunFacts(
            exit_code=code, signal=sig, stdout=stdout, stderr=bytes(err.data),
            wall=wall, cpu=rusage.ru_utime + rusage.ru_stime, memory_peak=rusage.ru_maxrss * 1024,
            oom_killed=False, killed_for=killed_for, stuck=stuck,
        )  # fmt: skip
    finally:
        if proc is not None and proc.returncode is None:  # cancelled or failed half-way
            _kill_run(proc, group if full else None)
            if full and group is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.to_thread(group.kill_all, time.monotonic() + REAP_GRACE))
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)  # noqa: ASYNC222 (never blocks)
            proc.returncode = -1
        if pidfd >= 0:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        for p in pipes:
            p.close()
        for fd in (stdin_fd, out_r, out_w, err_r, err_w, status_r, status_w, seccomp_fd):
            if fd >= 0:
                os.close(fd)
        # Something still leaving the groups is waited for in a thread.
        if full and group is not None and not group.try_remove():
            await asyncio.shield(asyncio.to_thread(group.destroy, time.monotonic() + REAP_GRACE))


def _kill_run(proc: subprocess.Popen[bytes] | None, group: BoxGroup | None) -> None:
    """SIGKILL the run's session (the engine's monitor, which takes the PID namespace with it)
    and, when there is one, every process in its cgroup."""
    if proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if group is not None:
        for pid in group.pids_in():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
