"""Run one untrusted command under resource limits (the program judge's isolation layer).

What a run gets (see docs/judges.md for what it does *not* get):

* an EMPTY environment (the worker's credentials are never passed on);
* a new session / process group, killed as a whole on wall timeout, output flood or cancellation;
* rlimits via ``prlimit``: CPU seconds (SIGXCPU, then SIGKILL), address space, processes, file size,
  open files, no core dumps;
* when the worker runs as root and ``unshare`` works ("full" isolation): new network namespace (no
  network at all), new PID namespace (every process of the run dies with it, ``setsid`` cannot
  escape), new mount namespace in which every mount is re-mounted read-only and the working
  directory is a size-capped tmpfs (or a bind of the build directory while compiling), and a
  dedicated unprivileged uid per slot with no capabilities and ``no_new_privs`` (cannot read the
  worker's ``/proc/<pid>/environ``, cannot signal other runs);
* otherwise ("basic"): rlimits, empty environment, process group and, where unprivileged user
  namespaces are allowed, ``unshare -rn`` for no network; same uid as the worker.

The command line is built by a pure function; the only I/O is spawning and piping.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Mode = Literal["full", "basic"]

#: The first process inside the namespaces (PID 1 there). It makes every mount read-only, gives
#: the run its one writable directory, mounts a /proc of the new PID namespace, and runs the
#: command as a child (not exec: PID 1 ignores default-action signals such as SIGXCPU) so the
#: exit status comes back as the shell's (128 + signal for a signal death).
SETUP_SCRIPT = """\
set -e
dir="$1"; mode="$2"; size="$3"; shift 3
while read -r _src target _rest; do
  mount -o remount,bind,ro "$target" 2>/dev/null || true
done < /proc/self/mounts
if [ "$mode" = tmpfs ]; then
  mount -t tmpfs -o "size=${size}k,mode=0777,nosuid,nodev" tmpfs "$dir"
else
  mount --bind "$dir" "$dir"
  mount -o remount,bind,rw,nosuid,nodev "$dir"
fi
mount -t proc -o nosuid,nodev,noexec proc /proc 2>/dev/null || true
cd "$dir"
set +e
"$@"
exit $?
"""


@dataclass(frozen=True)
class Limits:
    """Limits of one run. ``cpu`` and ``wall`` in seconds, sizes in bytes."""

    cpu: float = 2.0
    wall: float = 5.0
    memory: int = 256 * 1024 * 1024
    output: int = 1024 * 1024
    file_size: int = 16 * 1024 * 1024
    processes: int = 16
    open_files: int = 64
    scratch: int = 16 * 1024 * 1024  # size of the tmpfs working directory (full mode)
    stderr: int = 64 * 1024  # stderr kept for diagnostics; the rest is discarded


@dataclass(frozen=True)
class RunResult:
    """How a run ended."""

    exit_code: int | None  # None when killed by a signal
    signal: int | None
    stdout: bytes
    stderr: bytes
    wall: float
    timed_out: bool = False
    output_exceeded: bool = False


@dataclass(frozen=True)
class Isolation:
    """What this host lets the sandbox do (detected once, see :func:`detect_isolation`)."""

    mode: Mode
    network_namespace: bool
    prlimit: str


@lru_cache(maxsize=1)
def detect_isolation() -> Isolation:
    """Probe the host once: root + working ``unshare`` gives full isolation, else basic."""
    prlimit = shutil.which("prlimit") or ""
    unshare = shutil.which("unshare")
    if not prlimit:
        raise RuntimeError("the program judge needs prlimit (util-linux) on PATH")
    if (
        unshare
        and os.geteuid() == 0
        and shutil.which("setpriv")
        and _probe([unshare, "--net", "--mount", "--pid", "--fork", "true"])
    ):
        return Isolation("full", True, prlimit)
    net = bool(unshare) and _probe([str(unshare), "-rn", "true"])
    return Isolation("basic", net, prlimit)


def _probe(argv: Sequence[str]) -> bool:
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=10, env={}).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def prlimit_args(limits: Limits) -> list[str]:
    """``prlimit`` options for ``limits`` (pure). CPU: SIGXCPU at the soft limit, SIGKILL one second later."""
    cpu = max(1, math.ceil(limits.cpu))
    return [
        f"--cpu={cpu}:{cpu + 1}",
        f"--as={limits.memory}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_size}",
        f"--nofile={limits.open_files}",
        "--core=0",
    ]


def build_command(
    argv: Sequence[str],
    *,
    box: str,
    limits: Limits,
    isolation: Isolation,
    uid: int,
    writable_box: bool,
) -> list[str]:
    """The full command line that runs ``argv`` in ``box`` under ``limits`` (pure).

    ``writable_box``: the run may write into ``box`` itself (compiling); otherwise its working
    directory is ``box/run`` (created here) with a fresh size-capped tmpfs mounted on it (full mode),
    and ``box`` (sources, binary) is read-only.
    """
    limited = [isolation.prlimit, *prlimit_args(limits), "--", *argv]
    if isolation.mode == "full":
        return [
            "unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "--",
            "/bin/sh", "-c", SETUP_SCRIPT, "sandbox", workdir(box, writable_box), "bind" if writable_box else "tmpfs",
            str(max(64, limits.scratch // 1024)),
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--",
            *limited,
        ]  # fmt: skip
    if isolation.network_namespace:
        return ["unshare", "-rn", "--", *limited]
    return limited


def workdir(box: str, writable_box: bool) -> str:
    """Where a run starts (pure): the box itself when compiling, else its scratch directory."""
    return box if writable_box else os.path.join(box, "run")


async def run(
    argv: Sequence[str],
    *,
    box: str,
    stdin: bytes,
    limits: Limits,
    isolation: Isolation,
    uid: int,
    writable_box: bool = False,
    env: dict[str, str] | None = None,
) -> RunResult:
    """Run ``argv`` sandboxed, feeding ``stdin``; kills the whole run on timeout, flood or cancellation."""
    command = build_command(argv, box=box, limits=limits, isolation=isolation, uid=uid, writable_box=writable_box)
    cwd = workdir(box, writable_box)
    os.makedirs(cwd, mode=0o777, exist_ok=True)
    os.chmod(cwd, 0o777)  # basic mode: the run writes here (full mode mounts a tmpfs over it)
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env or {},
        start_new_session=True,
        close_fds=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out = bytearray()
    err = bytearray()
    exceeded = False

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.close()

    async def collect_stdout() -> None:
        nonlocal exceeded
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            out.extend(chunk)
            if len(out) > limits.output:
                exceeded = True
                _kill(proc.pid)
                return

    async def collect_stderr() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(65536):
            if len(err) < limits.stderr:
                err.extend(chunk[: limits.stderr - len(err)])

    io = asyncio.gather(feed(), collect_stdout(), collect_stderr())
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(io), limits.wall)
        except TimeoutError:
            timed_out = True
            _kill(proc.pid)
        code = await proc.wait()
    finally:
        if proc.returncode is None:  # cancelled (lost lease, shutdown): take the whole run down
            _kill(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
        io.cancel()
        with contextlib.suppress(BaseException):
            await io
    exit_code, sig = decode_status(code)
    return RunResult(
        exit_code=exit_code,
        signal=sig,
        stdout=bytes(out[: limits.output]),
        stderr=bytes(err),
        wall=time.monotonic() - started,
        timed_out=timed_out,
        output_exceeded=exceeded,
    )


def decode_status(code: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from a return code (pure).

    Negative: our direct child died of a signal. 128 + n: the namespace's shell reports a signal
    death of the program that way (an exit status above 128 is read as a signal, as shells do).
    """
    if code < 0:
        return None, -code
    if 128 < code < 128 + 65:
        return None, code - 128
    return code, None


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
