"""A throwaway PgBouncer (the Debian ``pgbouncer`` package) owned by a test, on a free loopback port.

It pools in ``transaction`` mode with fewer server connections than the roles have clients, so
consecutive transactions of one client really do land on different server sessions (what breaks
named prepared statements, LISTEN and session locks), and it keeps PgBouncer's defaults otherwise:
no ``ignore_startup_parameters``, no ``max_prepared_statements`` (1.18 has none). PgBouncer refuses
to run as root, so as root it runs as the ``postgres`` user, like the throwaway Postgres servers.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.redis_servers import free_port
from tests.support.roles import stop_process
from tests.support.waiting import wait_for

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """One pgbouncer process forwarding every database name to ``backend_host:backend_port``."""

    def __init__(
        self,
        backend_host: str,
        backend_port: int,
        workdir: Path,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 3,
    ) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.ini = workdir / "pgbouncer.ini"
        (workdir / "userlist.txt").write_text('"postgres" ""\n')
        self.ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={backend_host} port={backend_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {workdir / 'userlist.txt'}",
                    f"pool_mode = {pool_mode}",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 500",
                    f"logfile = {workdir / 'pgbouncer.log'}",
                    f"pidfile = {workdir / 'pgbouncer.pid'}",
                    "admin_users = postgres",
                    "",
                ]
            )
        )
        as_user: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        self.process = subprocess.Popen(
            [*as_user, PGBOUNCER, str(self.ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_ready()

    def dsn_for(self, backend_dsn: str) -> str:
        """``backend_dsn`` (same user and database) through this PgBouncer."""
        parts = urlsplit(backend_dsn)
        return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{self.port}"))

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def _pid(self) -> int | None:
        try:
            return int((self.workdir / "pgbouncer.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _wait_ready(self, within: float = 10.0) -> None:
        def listening() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.process.returncode}): {self.log()}")
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, within, f"pgbouncer listening on {self.port}", every=0.02)

    def stop(self) -> None:
        pid = self._pid()
        if pid is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # pgbouncer itself (runuser only waits for it)
        stop_process(self.process, 10, terminate=False)


@contextlib.contextmanager
def pgbouncer(backend_dsn: str, *, pool_mode: str = "transaction", pool_size: int = 3) -> Iterator[PgBouncer]:
    """A PgBouncer in front of the Postgres server of ``backend_dsn``, stopped when the context exits."""
    parts = urlsplit(backend_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="jq-pgbouncer-"))
    server: PgBouncer | None = None
    try:
        server = PgBouncer(
            parts.hostname or "127.0.0.1", parts.port or 5432, workdir, pool_mode=pool_mode, pool_size=pool_size
        )
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
