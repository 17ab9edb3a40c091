"""A role that does not trust Redis' TLS certificate says so on ``/readyz``, not just "ConnectionError".

A real redis-server with TLS on (a self-signed certificate made with openssl), a worker with a
``rediss://`` URL and no CA for it: the probe names the certificate failure, which is what an
operator must fix (mount the CA, or fix the server's certificate)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.queries import create_queue_at
from tests.support.redis_servers import RedisServer, free_port, redis_server
from tests.support.roles import RoleProcess, clean_env, http_get, role_env
from tests.support.waiting import wait_for


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, int]]:
    """A redis-server with a plain port (for its own readiness check) and a TLS port."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    tls_port = free_port()
    with redis_server("--tls-port", str(tls_port), "--tls-cert-file", str(tmp_path / "cert.pem"),
                      "--tls-key-file", str(tmp_path / "key.pem"), "--tls-auth-clients", "no") as server:
        yield server, tls_port


async def test_an_untrusted_redis_certificate_is_named_on_readyz(
    tls_redis: tuple[RedisServer, int], pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    _, tls_port = tls_redis
    await create_queue_at(pg_dsn, queue_name)
    env = clean_env(**role_env(pg_dsn, queue_name, redis_url=f"rediss://127.0.0.1:{tls_port}/0",
                               JUDGEQUEUE_JUDGE="sleep"))
    proc = RoleProcess("worker", env, tmp_path / "worker.log")
    try:
        port = proc.port()

        def redis_check() -> str | None:
            status, body = http_get(port, "/readyz")
            if status == 200:
                return None
            try:
                check = str(json.loads(body)["checks"].get("redis", ""))
            except (ValueError, KeyError):
                return None
            return check if check.startswith("unreachable") else None

        check = wait_for(redis_check, 30, "the worker's /readyz naming Redis' failure")
        assert check.startswith("unreachable: ConnectionError: TLS certificate verify failed:"), check
        assert "self-signed certificate" in check, check
    finally:
        proc.ensure_dead()
