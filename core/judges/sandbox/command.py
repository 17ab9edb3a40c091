"""The command line of a boxed run (pure): its limits, the facts it ends with, how it is isolated,
and the shim and bubblewrap arguments that start it. :mod:`.run` starts it; the threat model and the
whole chain are described there and in docs/judges.md."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Mode = Literal["full", "trusted"]
KilledFor = Literal["cpu", "wall", "output"]
BOX = "/box"  # where the box directory appears inside the sandbox
SCRATCH = "/tmp"
PATH = "/usr/local/bin:/usr/bin:/bin"
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
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
    waited: float = 0.0  # seconds its longest-waiting task was runnable but had no CPU (a loaded machine)
    ended: float = 0.0  # time.monotonic() when the worker saw the program end (0: not known)


@dataclass(frozen=True)
class Isolation:
    """How runs are isolated on this worker (decided once, see :mod:`.capabilities`)."""

    mode: Mode
    bwrap: str = ""
    setpriv: str = ""
    ro_paths: tuple[str, ...] = ()  # directories bound read-only
    symlinks: tuple[tuple[str, str], ...] = ()  # (target, link) e.g. ("usr/lib", "/lib")
    seccomp: bytes = b""
    #: bubblewrap's --disable-userns where it works (not under a read-only /proc/sys); the seccomp
    #: filter refuses namespaces either way
    disable_userns: bool = True


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
    isolation: Isolation,
    *,
    box: str,
    writable_box: bool,
    limits: Limits,
    seccomp_fd: int,
    status_fd: int,
    block_fd: int | None = None,
    as_pid_1: bool = False,
) -> list[str]:
    """bubblewrap's options for one run (pure). ``as_pid_1``: the command is the namespace's init
    (only for the box runner, :mod:`.box_runner`, which reaps; a program must never be init: the
    kernel would drop the signals it sends itself)."""
    args = [
        isolation.bwrap,
        "--unshare-all", "--unshare-user", *(["--disable-userns"] if isolation.disable_userns else []),
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "box", "--clearenv",
        "--setenv", "PATH", PATH,
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
    if block_fd is not None:  # everything but the exec is done before bubblewrap waits on it
        args += ["--block-fd", str(block_fd)]
    if as_pid_1:
        args += ["--as-pid-1"]
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
    block_fd: int | None = None,
    as_pid_1: bool = False,
) -> list[str]:
    """The whole command line of one run (pure)."""
    if isolation.mode == "trusted":
        return ["/bin/sh", "-c", trusted_shim_script(limits), "shim", *argv]
    drop = [
        isolation.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip
    engine = bwrap_args(
        isolation, box=box, writable_box=writable_box, limits=limits, seccomp_fd=seccomp_fd, status_fd=status_fd,
        block_fd=block_fd, as_pid_1=as_pid_1,
    )  # fmt: skip
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


def engine_child_pid(status_report: bytes) -> int | None:
    """The pid of the namespace's init bubblewrap reported first on its status descriptor (pure)."""
    for line in status_report.decode("utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and isinstance(doc.get("child-pid"), int):
                return int(doc["child-pid"])
    return None
