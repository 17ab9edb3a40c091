"""The operator's own connections (cutover writes, backlog reads) behind a real PgBouncer in transaction
mode and through a real Redis Sentinel, as the roles' are: Kopf against kmock, real servers.

The PgBouncer pools onto ONE server session, so every client the operator opens lands on the session
the previous one left its prepared statements on: a client that names statements (asyncpg's cache,
``pooler: none``) collides with them on its second connection, which the first test shows directly.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import asyncpg.connection
import pytest
import redis.asyncio as aioredis

from judgequeue.controllers.scaling import measure_backlog
from judgequeue.controllers.state import Connections
from judgequeue.core.store.outbox import submit
from judgequeue.core.store.queues import create_queue, get_queue
from tests.support.databases import ADMIN_DSN, REDIS_URL
from tests.support.kmock_emulator import (
    JQ,
    StrictEmulator,
)
from tests.support.operator import NS, operator_env, spec
from tests.support.pgbouncer import PgBouncer, pgbouncer
from tests.support.redis_servers import RedisServer, free_port, start_sentinel, wait_sentinels_settled
from tests.support.waiting import eventually

pytestmark = pytest.mark.kmock(cls=StrictEmulator)

MASTER = "opmaster"
ROOT = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    with pgbouncer(ADMIN_DSN, pool_mode="transaction", pool_size=1) as server:
        yield server


@pytest.fixture
def sentinel_url() -> Iterator[tuple[str, RedisServer]]:
    """A master watched by one sentinel (quorum 1): the URL names the sentinel, never the master."""
    with tempfile.TemporaryDirectory(prefix="jq-op-sentinel-") as tmp:
        servers: list[RedisServer] = []
        try:
            master = RedisServer(free_port(), Path(tmp) / "master")
            servers.append(master)
            sentinel = start_sentinel(Path(tmp) / "sentinel", MASTER, master.port, quorum=1)
            servers.append(sentinel)
            wait_sentinels_settled([sentinel], MASTER, 0)
            yield f"redis+sentinel://127.0.0.1:{sentinel.port}/{MASTER}/0", master
        finally:
            for server in servers:
                server.stop()


#: A previous operator process: starting its statement names where this process's next ones start
#: (``start``), it reads the backlog with asyncpg's statement cache on (``pooler: none``) until its
#: names pass ``until``, and exits. Its named statements stay on the pooler's one server session, as a
#: restarted operator pod's predecessor's do. Starting at ``start`` keeps its work the same whatever
#: number of statements this process made before (a whole tier's worth in one pytest process).
PREVIOUS_OPERATOR = """
import asyncio, sys
import asyncpg.connection
from judgequeue.controllers.scaling import measure_backlog
from judgequeue.controllers.state import Connections

async def main(dsn, redis_url, queue, start, until):
    asyncpg.connection._uid = start
    conns = Connections(dsn, redis_url, pooler="none")
    while asyncpg.connection._uid < until:
        await measure_backlog(conns, queue, io_timeout=5.0)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
"""


async def _previous_operator(dsn: str, queue: str) -> None:
    """Run :data:`PREVIOUS_OPERATOR` past every statement name this process may use in the next reads."""
    start = asyncpg.connection._uid
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PREVIOUS_OPERATOR, dsn, REDIS_URL, queue, str(start), str(start + 200),
        cwd=ROOT.parent)
    assert await asyncio.wait_for(proc.wait(), 60) == 0


async def test_a_restarted_operator_with_a_statement_cache_breaks_behind_this_pgbouncer(
    bouncer: PgBouncer, pg_dsn: str, queue_name: str, pg: asyncpg.Connection
) -> None:
    """The control: the backlog read of a restarted operator with ``pooler: none`` collides with the
    statements its predecessor left on the pooler's server session; with ``pooler: transaction``
    (what the spec's ``postgres.pooler`` gives the operator's connections) it names none and works on
    the same session. (A second predecessor would itself collide with the first's statements.)"""
    await create_queue(pg, queue_name)
    dsn = bouncer.dsn_for(pg_dsn)
    await _previous_operator(dsn, queue_name)
    with pytest.raises(asyncpg.PostgresError, match="already exists"):
        await measure_backlog(Connections(dsn, REDIS_URL, pooler="none"), queue_name, io_timeout=3.0)
    ok = Connections(dsn, REDIS_URL, pooler="transaction")
    for _ in range(3):
        assert (await measure_backlog(ok, queue_name, io_timeout=3.0)).total == 0
    await submit(pg, queue_name, {"n": 1})
    assert (await measure_backlog(ok, queue_name, io_timeout=3.0)).total == 1


async def test_operator_behind_pgbouncer_transaction_mode_and_sentinel(
    kmock: StrictEmulator, tmp_path: Path, bouncer: PgBouncer, pg_dsn: str, queue_name: str,
    pg: asyncpg.Connection, sentinel_url: tuple[str, RedisServer],
) -> None:
    url, master = sentinel_url
    await create_queue(pg, queue_name)
    await _previous_operator(bouncer.dsn_for(pg_dsn), queue_name)  # a restarted operator's predecessor
    async with operator_env(kmock, tmp_path, pg_dsn, dsn=bouncer.dsn_for(pg_dsn), redis_url=url, db_timeout=3.0) as env:
        env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"},
                                      "spec": spec(queue_name, postgres={"pooler": "transaction"})})
        await env.observed(1)
        await eventually(lambda: env.condition("CutoverApplied").get("status") == "True", what="cutover applied")
        for i in range(5):
            await submit(pg, queue_name, {"n": i})
        stream = aioredis.Redis(port=master.port)
        try:
            key = f"jq:{{{queue_name}}}:stream"
            await stream.xgroup_create(key, "workers", id="0-0", mkstream=True)
            for i in range(3):
                await stream.xadd(key, {"submission": str(i), "generation": "1"})
        finally:
            await stream.aclose()
        # Outbox through PgBouncer, stream lag from the master the sentinel names: 5 + 3.
        await eventually(lambda: (env.cr()["status"].get("backlog") or {}).get("total") == 8, what="backlog 8")
        # A cutover write through the pooler after many ticks' reads (the shared server session).
        generation = await env.patch_cr({"spec": {"paused": True}})
        await env.observed(generation)
        await eventually(lambda: env.condition("CutoverApplied").get("status") == "True"
                         and env.cr()["status"]["cutover"].get("paused") is True, what="paused applied")
        assert (await get_queue(pg, queue_name)).paused is True
        assert env.condition("Degraded").get("status") == "False"


async def test_a_malformed_redis_url_is_reported_in_status(
    kmock: StrictEmulator, tmp_path: Path, pg_dsn: str, queue_name: str
) -> None:
    bad = "redis+sentinel://:hunter2@127.0.0.1:26379"  # no master name
    async with operator_env(kmock, tmp_path, pg_dsn, dsn=pg_dsn, redis_url=bad, db_timeout=3.0) as env:
        env.kmock.put_object(JQ, NS, {"metadata": {"name": "judge"}, "spec": spec(queue_name)})
        await env.observed(1)
        degraded = env.condition("Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "InvalidConnection", degraded
        assert "jq-redis key url" in degraded["message"] and "master" in degraded["message"]
        assert "hunter2" not in degraded["message"]
        await asyncio.sleep(1)  # a few timer ticks: still reported, the operator still running
        assert env.condition("Degraded")["reason"] == "InvalidConnection"
        assert env.operator.error is None
