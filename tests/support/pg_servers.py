"""A throwaway PostgreSQL server owned by a test (initdb + pg_ctl in a temporary directory).

Restart and crash tests need a server they may stop, kill and start again without touching the
shared one. PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres``
user and every command runs through ``runuser``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.redis_servers import free_port


def _bindir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent  # a symlink into the version's bin directory
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not candidates:
        raise RuntimeError("pg_ctl not found (install postgresql)")
    return Path(candidates[-1]).parent


class PostgresServer:
    """A cluster of its own: a new one (initdb), or a streaming standby of ``standby_of``.

    ``settings`` are extra ``-c name=value`` server options for this server only (a standby made
    from it does not inherit them: they are command-line options, not in its configuration files).
    ``via_port``: the standby reaches its primary through this port (a proxy the test controls).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        settings: dict[str, str] | None = None,
        standby_of: PostgresServer | None = None,
        via_port: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.data = workdir / "data"
        self.port = free_port()
        self.bindir = _bindir()
        self.settings = dict(settings or {})
        self._as_user: list[str] = []
        self._held: int | None = None
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(workdir, owner.pw_uid, owner.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        if standby_of is None:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        else:
            # -R writes primary_conninfo and standby.signal; initdb's pg_hba trusts loopback replication.
            self._run(
                "pg_basebackup", "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "--no-sync",
                "-h", "127.0.0.1", "-p", str(via_port or standby_of.port), "-U", "postgres",
            )  # fmt: skip
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self._as_user, str(self.bindir / tool), *args], check=True, capture_output=True)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _options(self) -> str:
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        return options + "".join(f" -c {name}={value}" for name, value in self.settings.items())

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-o", self._options(), "-l", str(self.workdir / "log"), "-w", "start")

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m <mode>``: every session ended (``fast``: after a checkpoint), then up again."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-m", mode, "-o", self._options(), "-l", str(self.workdir / "log"),
            "-w", "restart",
        )  # fmt: skip

    def promote(self) -> None:
        """End recovery on a standby: it becomes a writable primary (waits until it is)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def crash(self) -> None:
        """Stop like a crash: no checkpoint, clients cut off mid-statement."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        if self._held is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._held, signal.SIGCONT)  # a frozen WAL writer would stall the shutdown
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def wal_writer_pid(self) -> int:
        """The WAL writer among the postmaster's children, read from /proc (no procps needed)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # exited meanwhile
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == postmaster and "walwriter" in title:
                return int(entry.name)
        raise RuntimeError(f"no walwriter among the children of postmaster {postmaster}")

    def hold_wal_writer(self) -> int:
        """Freeze the WAL writer: asynchronous commits then stay in shared memory, lost in a crash.

        (Synchronous commits still reach the OS: the committing backend writes the WAL itself.)
        Returns its pid for :meth:`crash_by_killing`.
        """
        pid = self.wal_writer_pid()
        os.kill(pid, signal.SIGSTOP)
        self._held = pid
        return pid

    def crash_by_killing(self, pid: int) -> None:
        """SIGKILL one server process: the postmaster resets shared memory and runs crash recovery."""
        os.kill(pid, signal.SIGKILL)
        self._held = None


@contextlib.contextmanager
def postgres_server(
    *, settings: dict[str, str] | None = None, standby_of: PostgresServer | None = None, via_port: int | None = None
) -> Iterator[PostgresServer]:
    workdir = Path(tempfile.mkdtemp(prefix="jq-pg-"))
    server = None
    try:
        server = PostgresServer(workdir, settings=settings, standby_of=standby_of, via_port=via_port)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
