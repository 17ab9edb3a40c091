"""A private PostgreSQL cluster and Redis server for one benchmark run, and CPU accounting from /proc.

The project's machine is shared: the system Postgres and Redis serve other test runs too, so their
CPU cannot be attributed to one benchmark, and ``pg_stat_statements`` needs
``shared_preload_libraries`` (a server restart). A benchmark therefore starts its own servers:

* Postgres: ``initdb`` in a temporary directory (as the ``postgres`` user when run as root), the same
  durability as the system server (``fsync`` and ``synchronous_commit`` on), 128 MB shared buffers,
  ``shared_preload_libraries = pg_stat_statements``;
* Redis: ``redis-server`` without persistence, like the system one.

To use the system server instead (``--servers system``), pg_stat_statements must be preloaded there:

    psql -U postgres -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
    systemctl restart postgresql   # or: pg_ctlcluster 15 main restart

Without it the per-statement table is skipped (and said so); Postgres CPU then includes every
other client of that server.

CPU: ``utime + stime`` from ``/proc/<pid>/stat``. A Postgres backend that exits during the window
takes its CPU with it, but the postmaster reaps it, so the postmaster's ``cutime + cstime`` carries
it: the cluster's CPU is the postmaster's own and its reaped children's plus every live child's.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    return raw.rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """utime + stime of ``pid`` (plus its reaped children's with ``children``); 0 if it is gone."""
    f = _stat_fields(pid)
    if f is None:
        return 0.0
    # After the comm field: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    ticks = int(f[11]) + int(f[12])
    if children:
        ticks += int(f[13]) + int(f[14])
    return ticks / TICK


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        f = _stat_fields(int(entry.name))
        if f is not None and int(f[1]) == pid:
            out.append(int(entry.name))
    return out


def tree_cpu_seconds(root: int) -> float:
    """CPU of a process tree one level deep (a postmaster and its backends), reaped children included."""
    return cpu_seconds(root, children=True) + sum(cpu_seconds(c) for c in children_of(root))


_BACKGROUND_KINDS = ("autovacuum launcher", "autovacuum worker", "background writer", "logical replication launcher")


def postgres_process_kind(pid: int) -> tuple[str, int | None]:
    """What a postmaster child is, from its process title: ``("client", port)`` for a backend
    serving a TCP client (the client's port), else ``(name, None)`` (``walwriter``,
    ``autovacuum worker``, ...); ``("gone", None)`` if it exited."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ("gone", None)
    rest = title.removeprefix("postgres:").strip()
    first, _, after = rest.partition(" ")
    if first.endswith(":"):  # a cluster_name ("15/main: walwriter")
        rest = after.strip()
    # A client backend's title: "user database host(port) state"
    for word in rest.split()[:4]:
        if word.endswith(")") and "(" in word:
            port = word[word.rindex("(") + 1 : -1]
            if port.isdigit():
                return ("client", int(port))
    for kind in _BACKGROUND_KINDS:
        if rest.startswith(kind):
            return (kind, None)
    return (rest.split(" ", 1)[0] or "postgres", None)


def tcp_local_ports(pids: list[int]) -> set[int]:
    """Local ports of the TCP sockets the processes ``pids`` hold open (their client connections)."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _bindir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not candidates:
        raise RuntimeError("pg_ctl not found (install postgresql)")
    return Path(candidates[-1]).parent


@dataclass
class Servers:
    admin_dsn: str
    redis_url: str
    postmaster_pid: int
    redis_pid: int


#: The private cluster's ``max_connections`` unless a benchmark asks for another (Postgres's own default is 100).
MAX_CONNECTIONS = 300


@contextlib.contextmanager
def private_servers(
    *, shared_buffers: str = "128MB", max_connections: int = MAX_CONNECTIONS, settings: dict[str, str] | None = None
) -> Iterator[Servers]:
    """Start a private Postgres cluster and Redis server; stop and delete them afterwards.

    ``settings``: extra Postgres ``-c name=value`` options (e.g. ``autovacuum_naptime``).
    """
    workdir = Path(tempfile.mkdtemp(prefix="jq-bench-srv-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(workdir, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    bindir = _bindir()
    data = workdir / "data"
    pg_port, redis_port = free_port(), free_port()
    redis_proc: subprocess.Popen[bytes] | None = None
    started = False
    try:
        subprocess.run(
            [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
        options = (
            f"-p {pg_port} -k {workdir} -c listen_addresses=127.0.0.1 -c max_connections={max_connections}"
            f" -c shared_buffers={shared_buffers} -c shared_preload_libraries=pg_stat_statements"
            " -c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on"
            " -c fsync=on -c synchronous_commit=on"
        ) + "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        subprocess.run(
            [
                *as_user,
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(workdir / "log"),
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        started = True
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        redis_proc = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", redis_port), timeout=0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.05)  # waiting for a server socket to open, not synchronising a test
        yield Servers(
            f"postgresql://postgres@127.0.0.1:{pg_port}/postgres",
            f"redis://127.0.0.1:{redis_port}/0",
            postmaster,
            redis_proc.pid,
        )
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait()
        if started:
            subprocess.run(
                [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                check=False,
            )
        shutil.rmtree(workdir, ignore_errors=True)


def system_pids(admin_dsn: str, redis_url: str) -> tuple[int | None, int | None]:
    """The postmaster and redis-server pids of system servers on this host, when found."""
    postmaster = redis_pid = None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = os.path.basename(cmd[0].decode(errors="replace")) if cmd and cmd[0] else ""
        f = _stat_fields(int(entry.name))
        if f is None:
            continue
        if name in ("postgres", "postmaster") and int(f[1]) == 1:
            postmaster = int(entry.name)
        if name.startswith("redis-server"):
            redis_pid = int(entry.name)
    return postmaster, redis_pid
