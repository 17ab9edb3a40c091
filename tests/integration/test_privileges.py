"""Least privilege, against real Postgres and Redis: each component's credentials do its job and no more.

Each test makes login users of its own in both servers: in Postgres, a ``LOGIN`` role given a
component's group role (``GRANT judgequeue_worker TO ...``, as docs/security.md tells an operator);
in Redis, an ACL user with :func:`judgequeue.core.transport.acl.acl_rules` for the test's queue. The
attack catalogue runs what each component must not do with its own credentials and expects a
refusal from the server; the round runs every component with its own credentials.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis
import redis.exceptions as rexc

from judgequeue.core.judges.builtin import SleepJudge
from judgequeue.core.roles.dispatcher import Dispatcher
from judgequeue.core.roles.reaper.role import Reaper
from judgequeue.core.roles.worker.role import Worker
from judgequeue.core.runtime.process import ReadinessProbe
from judgequeue.core.store import dlq as _dlq  # noqa: F401 - registers the dead-letter script
from judgequeue.core.store import outbox, sql
from judgequeue.core.store.privileges import ROLES, queue_role
from judgequeue.core.store.queues import create_queue
from judgequeue.core.store.submissions import read as read_submissions
from judgequeue.core.transport import redis_scripts, streams
from judgequeue.core.transport.acl import acl_rules
from tests.support.databases import REDIS_URL, connection, delete_queue_keys
from tests.support.inprocess import running
from tests.support.roles import clean_env, run_cli
from tests.support.settings import make_settings, stream_settings
from tests.support.waiting import eventually

COMPONENTS = ("application", "dispatcher", "worker", "reaper", "operator")
PASSWORD = "jq-test-password"


@dataclass(frozen=True)
class Credentials:
    dsn: str
    redis_url: str | None


def _with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{host}"))


@pytest.fixture
async def other_queue(pg_dsn: str) -> AsyncIterator[str]:
    """A second queue, with a stream and a submission: what the attacks aim at."""
    name = f"o-{uuid.uuid4().hex[:10]}"
    client = aioredis.Redis.from_url(REDIS_URL)
    async with connection(pg_dsn) as conn:
        await create_queue(conn, name)
        await outbox.submit(conn, name, {"secret": "hidden test data"})
    await streams.ensure_group(client, name)
    yield name
    await delete_queue_keys(client, name)
    await client.aclose()


@pytest.fixture
async def creds(pg_dsn: str, queue_name: str) -> AsyncIterator[dict[str, Credentials]]:
    """Login users of each component for this test's database and ``queue_name``."""
    suffix = uuid.uuid4().hex[:8]
    admin = aioredis.Redis.from_url(REDIS_URL)
    await redis_scripts.load_scripts(admin)  # the migrator's job: the roles may not FUNCTION LOAD
    made: dict[str, Credentials] = {}
    scope = queue_role(queue_name)
    async with connection(pg_dsn) as conn:
        await conn.execute(f"CREATE ROLE \"{scope}\" NOLOGIN")
        for component in COMPONENTS:
            user = f"jqt_{component}_{suffix}"
            await conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{PASSWORD}'")
            await conn.execute(f"GRANT {ROLES[component].name} TO {user}")
            if component in ("dispatcher", "worker", "reaper"):  # split by queue, as in Redis
                await conn.execute(f"GRANT \"{scope}\" TO {user}")
            redis_url = None
            if component != "application":  # an application never talks to Redis
                await admin.execute_command(  # type: ignore[no-untyped-call]
                    "ACL", "SETUSER", user, "on", f">{PASSWORD}", *acl_rules(component, [queue_name])
                )
                redis_url = _with_user(REDIS_URL, user)
            made[component] = Credentials(_with_user(pg_dsn, user), redis_url)
    yield made
    async with connection(pg_dsn) as conn:
        for component in COMPONENTS:
            user = f"jqt_{component}_{suffix}"
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", user
            )
            await conn.execute(f"DROP ROLE IF EXISTS {user}")
            await admin.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
        await conn.execute(f"DROP ROLE IF EXISTS \"{scope}\"")
    await admin.aclose()


# --- Postgres -----------------------------------------------------------------------------------

Attack = Callable[[asyncpg.Connection, str, int], Awaitable[Any]]


async def _judging(conn: asyncpg.Connection, sid: int) -> None:
    """Lease ``sid`` as a legitimate worker would (the admin's connection plays that worker)."""
    await conn.fetch(sql.query("lease_acquire"), [sid], [1], [uuid.uuid4()], await _queue_of(conn, sid), 30.0)


async def _queue_of(conn: asyncpg.Connection, sid: int) -> str:
    return str(await conn.fetchval("SELECT queue FROM judgequeue.submissions WHERE id = $1", sid))


PG_ATTACKS: dict[str, Attack] = {
    "write a verdict directly": lambda c, q, sid: c.execute(
        "UPDATE judgequeue.submissions SET status = 'ACCEPTED' WHERE id = $1", sid
    ),
    "read another queue's payloads": lambda c, q, sid: c.fetch(
        "SELECT payload FROM judgequeue.submissions WHERE queue = $1", q
    ),
    "read submissions through the results function": lambda c, q, sid: c.fetch(
        sql.query("submissions_read"), [sid]
    ),
    "change flags directly": lambda c, q, sid: c.execute(
        "UPDATE judgequeue.queues SET paused = true WHERE name = $1", q
    ),
    "change flags through the cutover function": lambda c, q, sid: c.fetch(
        sql.query("queue_set_cutover"), q, None, False, None, True, None
    ),
    "drop a table": lambda c, q, sid: c.execute("DROP TABLE judgequeue.outbox"),
    "alter a table": lambda c, q, sid: c.execute("ALTER TABLE judgequeue.submissions ADD COLUMN x int"),
    "create a function in the schema": lambda c, q, sid: c.execute(
        "CREATE FUNCTION judgequeue.x() RETURNS int LANGUAGE sql AS 'SELECT 1'"
    ),
    "insert an outbox row": lambda c, q, sid: c.execute(
        "INSERT INTO judgequeue.outbox (queue, submission_id, generation) VALUES ($1, $2, 9)", q, sid
    ),
    "submit": lambda c, q, sid: c.fetchval(sql.query("submit_in_class"), q, "{}", None, None),
    "lease a job": lambda c, q, sid: c.fetch(sql.query("lease_acquire"), [sid], [1], [uuid.uuid4()], q, 30.0),
    "store a verdict through the verdict function": lambda c, q, sid: c.fetch(
        sql.query("lease_verdict"), [sid], [1], [uuid.uuid4()], ["ACCEPTED"], ["{}"]
    ),
    "rejudge": lambda c, q, sid: c.fetchval(sql.query("rejudge"), sid, None),
    "delete submissions through retention": lambda c, q, sid: c.fetchval(
        sql.query("submissions_prune"), 0.0, 1000, q, ["PENDING"]
    ),
    # the worker reads its own queue's classes, the reaper its own queue's agreement figures
    "read another queue's classes": lambda c, q, sid: c.fetch(sql.query("queue_classes"), q),
    "read another queue's shadow agreement": lambda c, q, sid: c.fetch(
        sql.query("shadow_agreement"), q, ["ACCEPTED"]
    ),
}

#: What each component must not do (all of PG_ATTACKS but what its job is).
MUST_NOT: dict[str, list[str]] = {
    # "lease a job" of another queue: refused, the worker holds only its own queue's role
    "worker": [a for a in PG_ATTACKS if a != "store a verdict through the verdict function"],
    "dispatcher": list(PG_ATTACKS),
    "reaper": [a for a in PG_ATTACKS if a not in {"delete submissions through retention"}],
    "application": [a for a in PG_ATTACKS if a not in {"submit", "read submissions through the results function"}],
    # the operator serves every queue (no queue role): it reads any queue's classes and agreement
    "operator": [a for a in PG_ATTACKS if a not in {"change flags through the cutover function",
                                                    "read another queue's classes",
                                                    "read another queue's shadow agreement"}],
}


@pytest.mark.parametrize(
    ("component", "attack"), [(c, a) for c, attacks in MUST_NOT.items() for a in attacks]
)
async def test_postgres_refuses_what_a_component_must_not_do(
    creds: dict[str, Credentials], pg_dsn: str, other_queue: str, component: str, attack: str
) -> None:
    async with connection(pg_dsn) as admin:
        sid = int(await admin.fetchval("SELECT id FROM judgequeue.submissions WHERE queue = $1", other_queue))
        before = await admin.fetchrow("SELECT status, verdict FROM judgequeue.submissions WHERE id = $1", sid)
    async with connection(creds[component].dsn) as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await PG_ATTACKS[attack](conn, other_queue, sid)
    async with connection(pg_dsn) as admin:
        after = await admin.fetchrow("SELECT status, verdict FROM judgequeue.submissions WHERE id = $1", sid)
        assert after == before
        assert await admin.fetchval("SELECT paused FROM judgequeue.queues WHERE name = $1", other_queue) is False


async def test_a_worker_stores_a_verdict_only_for_a_lease_it_holds(
    creds: dict[str, Credentials], pg_dsn: str, queue_name: str
) -> None:
    """The verdict function is the worker's to call, but its fence wants the attempt id its own lease
    drew: another worker's lease (or no lease at all) stores nothing, whatever id and generation."""
    async with connection(pg_dsn) as admin:
        await create_queue(admin, queue_name)
        sid = int(await outbox.submit(admin, queue_name, {"i": 1}))
        pending = int(await outbox.submit(admin, queue_name, {"i": 2}))
        await _judging(admin, sid)  # another worker holds this one
    async with connection(creds["worker"].dsn) as worker:
        for target in (sid, pending):
            rows = await worker.fetch(
                sql.query("lease_verdict"), [target], [1], [uuid.uuid4()], ["ACCEPTED"], ['{"forged": true}']
            )
            assert rows == []
        # Nor can it learn the attempt id it would need: the lease's row is not its to read.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await worker.fetch("SELECT attempt_id FROM judgequeue.submissions WHERE id = $1", sid)
        # Its own lease, taken through its function, it may finish.
        [lease] = await worker.fetch(sql.query("lease_acquire"), [pending], [1], [uuid.uuid4()], queue_name, 30.0)
        [done] = await worker.fetch(
            sql.query("lease_verdict"), [pending], [1], [lease["attempt_id"]], ["ACCEPTED"], ['{"ok": true}']
        )
        assert done["attempt_id"] == lease["attempt_id"]
    async with connection(pg_dsn) as admin:
        rows = {r["id"]: r["status"] for r in await admin.fetch(
            "SELECT id, status FROM judgequeue.submissions WHERE id = ANY($1)", [sid, pending]
        )}
    assert rows == {sid: "JUDGING", pending: "ACCEPTED"}


async def test_a_user_without_a_queue_role_serves_every_queue(
    creds: dict[str, Credentials], pg_dsn: str, other_queue: str
) -> None:
    """Queue roles split a fleet by credentials only where given: a login user holding just its
    component's role (a single fleet, the quick start's shape) serves every queue."""
    user = f"jqt_unscoped_{uuid.uuid4().hex[:8]}"
    async with connection(pg_dsn) as admin:
        await admin.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{PASSWORD}' IN ROLE {ROLES['worker'].name}")
        sid = int(await admin.fetchval("SELECT id FROM judgequeue.submissions WHERE queue = $1", other_queue))
    try:
        async with connection(_with_user(pg_dsn, user)) as worker:
            [lease] = await worker.fetch(sql.query("lease_acquire"), [sid], [1], [uuid.uuid4()], other_queue, 30.0)
        assert lease["id"] == sid
        async with connection(creds["worker"].dsn) as scoped:
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="may not serve queue"):
                await scoped.fetch(sql.query("queue_get"), other_queue)
    finally:
        async with connection(pg_dsn) as admin:
            await admin.execute(f"DROP ROLE {user}")


async def test_an_application_cancels_and_reads_histories_in_its_queues_only(
    creds: dict[str, Credentials], pg_dsn: str, queue_name: str, other_queue: str
) -> None:
    """The application role may cancel and read a history (through the API's statements and the SQL
    function); given a queue role, only in that queue; a worker may do neither."""
    from judgequeue.core import api

    async with connection(pg_dsn) as admin:
        await create_queue(admin, queue_name)
        mine = await outbox.submit(admin, queue_name, {"i": 1})
        theirs = int(await admin.fetchval("SELECT id FROM judgequeue.submissions WHERE queue = $1", other_queue))
    async with connection(creds["application"].dsn) as app:
        assert (await api.cancel(app, queue_name, mine, "duplicate")).cancelled_now
        assert [(e.status, e.cause) for e in await api.history(app, queue_name, mine)] == [("CANCELLED", "cancelled")]
        rows = await app.fetch("SELECT * FROM judgequeue.cancel($1, $2, $3)", queue_name, mine, "again")
        assert [tuple(r) for r in rows] == [(2, False)]
    async with connection(creds["worker"].dsn) as worker:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await api.cancel(worker, queue_name, mine, "not a worker's job")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await api.history(worker, queue_name, mine)
    user = creds["application"].dsn.split("//", 1)[1].split(":", 1)[0]
    async with connection(pg_dsn) as admin:
        await admin.execute(f'GRANT "{queue_role(queue_name)}" TO {user}')
    async with connection(creds["application"].dsn) as app:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="may not serve queue"):
            await api.cancel(app, other_queue, theirs, "not my queue")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="may not serve queue"):
            await api.history(app, other_queue, theirs)
        assert len(await api.history(app, queue_name, mine)) == 1
    async with connection(pg_dsn) as admin:
        assert await admin.fetchval("SELECT status FROM judgequeue.submissions WHERE id = $1", theirs) == "PENDING"


# --- Redis --------------------------------------------------------------------------------------

RedisAttack = Callable[[aioredis.Redis, str], Awaitable[Any]]

REDIS_ATTACKS: dict[str, RedisAttack] = {
    "XADD to another queue's stream": lambda r, o: r.xadd(streams.stream_key(o), {"submission": "1"}),
    "DEL another queue's keys": lambda r, o: r.delete(streams.stream_key(o)),
    "read another queue's stream": lambda r, o: r.xrange(streams.stream_key(o)),
    "FLUSHALL": lambda r, o: r.flushall(),
    "FLUSHDB": lambda r, o: r.flushdb(),
    "CONFIG SET": lambda r, o: r.config_set("maxmemory", "1"),
    "KEYS": lambda r, o: r.keys("*"),
    "EVAL an arbitrary script": lambda r, o: r.eval("return redis.call('FLUSHALL')", 0),
    "FUNCTION LOAD": lambda r, o: r.function_load(
        "#!lua name=x\nredis.register_function('x', function() return 1 end)"
    ),
    "a function on another queue's keys": lambda r, o: r.execute_command(
        "FCALL", redis_scripts.ACK.function, 1, streams.stream_key(o), streams.GROUP, "0-1"  # type: ignore[no-untyped-call]
    ),
}


@pytest.mark.parametrize(
    ("component", "attack"), [(c, a) for c in ("dispatcher", "worker", "reaper", "operator") for a in REDIS_ATTACKS]
)
async def test_redis_refuses_what_a_component_must_not_do(
    creds: dict[str, Credentials], other_queue: str, component: str, attack: str
) -> None:
    url = creds[component].redis_url
    assert url is not None
    admin = aioredis.Redis.from_url(REDIS_URL)
    await admin.xadd(streams.stream_key(other_queue), {"submission": "0"})
    length = await admin.xlen(streams.stream_key(other_queue))
    client = aioredis.Redis.from_url(url)
    try:
        with pytest.raises(rexc.NoPermissionError):
            await REDIS_ATTACKS[attack](client, other_queue)
        assert await admin.xlen(streams.stream_key(other_queue)) == length
    finally:
        await client.aclose()
        await admin.aclose()


# --- every component's normal work with its own credentials -------------------------------------


@pytest.mark.parametrize("intake", ["stream", "direct"])
async def test_a_whole_round_runs_with_each_components_own_credentials(
    creds: dict[str, Credentials], queue_name: str, intake: str
) -> None:
    """Operator creates the queue, the application submits and reads the verdicts, and the
    dispatcher, the worker (either intake: the stream, or direct takes and offers) and the reaper
    run with their own credentials in both servers."""
    async with contextlib.AsyncExitStack() as stack:
        pools: dict[str, asyncpg.Pool] = {}
        clients: dict[str, aioredis.Redis] = {}
        for component, c in creds.items():
            pool = await asyncpg.create_pool(c.dsn, min_size=1, max_size=4)
            assert pool is not None
            stack.push_async_callback(pool.close)
            pools[component] = pool
            if c.redis_url is not None:
                clients[component] = aioredis.Redis.from_url(c.redis_url)
                stack.push_async_callback(clients[component].aclose)

        async with pools["operator"].acquire() as conn:
            await create_queue(conn, queue_name)
        await streams.ensure_group(clients["dispatcher"], queue_name)
        async with pools["application"].acquire() as conn:
            ids = [await outbox.submit(conn, queue_name, {"status": s, "i": i})
                   for i, s in enumerate(["ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT"])]

        def settings(component: str, **env: str) -> Any:
            c = creds[component]
            assert c.redis_url is not None
            make = stream_settings if intake == "stream" else make_settings
            return make(c.dsn, c.redis_url, queue_name, **env)

        dispatcher = Dispatcher(pools["dispatcher"], clients["dispatcher"], settings("dispatcher", schedule="50ms"))
        worker_settings = settings("worker", grace_period="500ms")
        worker = Worker(pools["worker"], clients["worker"], worker_settings, judge=SleepJudge())
        reaper = Reaper(pools["reaper"], clients["reaper"], settings("reaper", reaper_interval="100ms"))
        async with running(dispatcher, worker, reaper):

            async def judged() -> bool:
                async with pools["application"].acquire() as conn:
                    rows = await read_submissions(conn, ids)
                return all(r["status"] not in ("PENDING", "JUDGING") for r in rows.values())

            await eventually(judged, within=30, what="three verdicts read with the application's credentials")
        async with pools["application"].acquire() as conn:
            rows = await read_submissions(conn, ids)
        assert [rows[i]["status"] for i in ids] == ["ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT"]


@pytest.mark.parametrize("who", ["superuser", "worker"])
async def test_a_role_warns_when_its_postgres_user_can_do_more_than_its_job(
    creds: dict[str, Credentials], pg_dsn: str, queue_name: str, who: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A quick start's single superuser URL keeps working, with a warning in the role's log."""
    dsn = pg_dsn if who == "superuser" else creds["worker"].dsn
    probe = ReadinessProbe(make_settings(dsn, REDIS_URL, queue_name), need_group=False)
    try:
        with caplog.at_level(logging.WARNING, logger="judgequeue"):
            ready = await probe()
    finally:
        await probe.close()
    assert ready.checks["postgres"] == "ok", ready.checks
    warned = [r for r in caplog.records if getattr(r, "event", None) == "broad_credentials"]
    assert len(warned) == (1 if who == "superuser" else 0), [r.getMessage() for r in caplog.records]


async def test_a_long_queue_names_role_is_the_one_the_functions_look_for(pg_dsn: str) -> None:
    """Names over 46 characters are cut and end with a digest: Python and the functions' SQL agree."""
    long_queue = "q" * 50 + f"-{uuid.uuid4().hex[:12]}"
    user = f"jqt_long_{uuid.uuid4().hex[:8]}"
    scope = queue_role(long_queue)
    async with connection(pg_dsn) as admin:
        await create_queue(admin, long_queue)
        await admin.execute(f'CREATE ROLE "{scope}" NOLOGIN')
        await admin.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{PASSWORD}' IN ROLE {ROLES['worker'].name}")
        await admin.execute(f'GRANT "{scope}" TO {user}')
    try:
        async with connection(_with_user(pg_dsn, user)) as worker:
            [row] = await worker.fetch(sql.query("queue_get"), long_queue)
            assert row["name"] == long_queue
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="may not serve queue"):
                await worker.fetch(sql.query("queue_get"), long_queue[:-1] + "x")
    finally:
        async with connection(pg_dsn) as admin:
            await admin.execute(f"DROP ROLE {user}")
            await admin.execute(f'DROP ROLE "{scope}"')


def test_migrate_with_a_redis_url_loads_every_function(pg_dsn: str) -> None:
    """The migrator loads the functions the roles' users may only call."""
    import redis

    admin = redis.Redis.from_url(REDIS_URL)
    try:
        with contextlib.suppress(rexc.ResponseError):  # not loaded yet
            admin.function_delete(redis_scripts.ENQUEUE.function)
        env = clean_env(JUDGEQUEUE_POSTGRES_DSN=pg_dsn, JUDGEQUEUE_REDIS_URL=REDIS_URL)
        done = run_cli("migrate", "--json", env=env)
        assert done.returncode == 0, done.stderr
        loaded = json.loads(done.stdout)["redis_functions"]
        assert redis_scripts.ENQUEUE.function in loaded and redis_scripts.ACK.function in loaded
        listed: Any = admin.function_list()
        libraries = {dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode() for lib in listed}
        assert set(loaded) <= libraries
    finally:
        admin.close()
