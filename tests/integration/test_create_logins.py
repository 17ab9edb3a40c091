"""``judgequeue roles --create-logins``: a login user per component, made by the command, real Postgres and Redis.

Each user gets its component's group role (and, for the dispatcher, worker and reaper, the queue's
role) and a Redis ACL user with its component's rules; the command prints each component's own DSN
and URL. With them a worker is refused what the attack catalogue refuses, and still does its job; a
second run gives new passwords to the same users.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
import redis
import redis.exceptions as rexc

from judgequeue.core.store import dlq  # noqa: F401 - registers its script
from judgequeue.core.store.privileges import ROLES, queue_role
from judgequeue.core.transport import endpoint_slots, redis_scripts  # noqa: F401 - endpoint_slots registers
from tests.support.databases import REDIS_URL
from tests.support.roles import clean_env, run_cli


@pytest.fixture
def prefix(pg_dsn: str) -> Iterator[str]:
    name = f"jqc_{uuid.uuid4().hex[:8]}"
    yield name
    admin = redis.Redis.from_url(REDIS_URL)
    try:
        for component in ("dispatcher", "worker", "reaper", "operator"):
            admin.execute_command("ACL", "DELUSER", f"{name}_{component}")  # type: ignore[no-untyped-call]
    finally:
        admin.close()


async def _memberships(conn: asyncpg.Connection, user: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
        " JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = $1", user)
    return {r["rolname"] for r in rows}


async def _drop(conn: asyncpg.Connection, users: list[str], queue: str) -> None:
    for user in users:
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", user)
        await conn.execute(f'DROP ROLE IF EXISTS "{user}"')
    await conn.execute(f'DROP ROLE IF EXISTS "{queue_role(queue)}"')


async def test_create_logins_makes_each_components_user_and_prints_its_connections(
    pg_dsn: str, pg: asyncpg.Connection, queue_name: str, prefix: str
) -> None:
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=REDIS_URL)
    # The users it makes may call the functions, never load one: it loads every one the components
    # call, the endpoints' slots and the dead-letter script among them (dropped here first).
    admin = redis.Redis.from_url(REDIS_URL)
    calls = [s.function for s in redis_scripts.registered_scripts()]
    assert {n.rsplit("_", 1)[0] for n in calls} >= {"jq_endpoint_acquire", "jq_dead_letter"}, calls
    for name in calls:
        with contextlib.suppress(rexc.ResponseError):
            admin.execute_command("FUNCTION", "DELETE", name)  # type: ignore[no-untyped-call]
    done = run_cli("roles", "--create-logins", "--prefix", prefix, "--queue", queue_name, "--json", env=env)
    assert done.returncode == 0, done.stderr
    libraries = admin.function_list()  # each library as its fields' names and values in turn
    loaded = {dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode() for lib in libraries}
    admin.close()
    assert set(calls) <= loaded, set(calls) - loaded
    out: dict[str, Any] = json.loads(done.stdout)
    users = [entry["user"] for entry in out.values()]
    try:
        assert set(out) == {"application", "dispatcher", "worker", "reaper", "operator"}
        for component, entry in out.items():
            assert entry["user"] == f"{prefix}_{component}" and entry["created"] is True
            held = await _memberships(pg, entry["user"])
            scoped = {queue_role(queue_name)} if component in ("dispatcher", "worker", "reaper") else set()
            assert held == {ROLES[component].name, *scoped}, (component, held)
            assert entry["postgres_dsn"].startswith(f"postgresql://{prefix}_{component}:")
            assert ("redis_url" in entry) == (component != "application")
        # The worker's own DSN: not a superuser, refused a table, its statements allowed.
        worker = await asyncpg.connect(out["worker"]["postgres_dsn"])
        try:
            assert await worker.fetchval("SELECT current_user") == f"{prefix}_worker"
            assert not await worker.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await worker.execute("UPDATE judgequeue.submissions SET status = 'ACCEPTED'")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await worker.execute("DROP TABLE judgequeue.outbox")
        finally:
            await worker.close()
        # The worker's own Redis URL: its queue's keys and commands, nothing else.
        client = redis.Redis.from_url(out["worker"]["redis_url"])
        try:
            assert client.ping()
            for refused in (("FLUSHALL",), ("CONFIG", "SET", "maxmemory", "1"), ("EVAL", "return 1", "0"),
                            ("XADD", "jq:{other}:stream", "*", "a", "b")):
                with pytest.raises(rexc.NoPermissionError):
                    client.execute_command(*refused)  # type: ignore[no-untyped-call]
            with pytest.raises(rexc.ResponseError, match="NOGROUP"):  # allowed: the stream is not there yet
                client.execute_command("XPENDING", f"jq:{{{queue_name}}}:stream", "workers")  # type: ignore[no-untyped-call]
        finally:
            client.close()
        # Again: the same users, new passwords.
        again = run_cli("roles", "--create-logins", "--prefix", prefix, "--queue", queue_name, "--json",
                        "--component", "worker", env=env)
        assert again.returncode == 0, again.stderr
        second = json.loads(again.stdout)
        assert set(second) == {"worker"} and second["worker"]["created"] is False
        assert second["worker"]["postgres_dsn"] != out["worker"]["postgres_dsn"]
        old = redis.Redis.from_url(out["worker"]["redis_url"])
        try:
            with pytest.raises(rexc.AuthenticationError):
                old.ping()
        finally:
            old.close()
    finally:
        await _drop(pg, users, queue_name)


def test_create_logins_refuses_a_redis_url_without_queues(pg_dsn: str) -> None:
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=REDIS_URL)
    done = run_cli("roles", "--create-logins", "--prefix", "jqc_none", env=env)
    assert done.returncode != 0
    assert "needs --queue" in done.stderr, done.stderr


def test_create_logins_refuses_a_bad_prefix(pg_dsn: str) -> None:
    env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn)
    done = run_cli("roles", "--create-logins", "--prefix", "Bad-Name", env=env)
    assert done.returncode != 0 and "must be a lowercase identifier" in done.stderr, done.stderr
