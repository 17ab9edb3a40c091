"""Server and network faults: Postgres crash-restart, Redis restart with and without persistence,
and a proxy that cuts or stalls connections. Roles run as real processes; every committed
submission must reach its verdict and the roles must ride out the fault without restarting."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import asyncpg

from judgequeue.core.store.queues import create_queue
from tests.support.databases import REDIS_URL, connection
from tests.support.pg_servers import PostgresServer
from tests.support.redis_servers import RedisServer, redis_server
from tests.support.roles import Roles, submit_retrying, wait_all_terminal
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually

OK = {"seconds": 0.005, "status": "ACCEPTED"}


def start_roles(roles: Roles) -> None:
    roles.start_all(workers=2)


async def submit_some(dsn: str, queue: str, n: int) -> list[int]:
    return [await submit_retrying(dsn, queue, OK) for _ in range(n)]


async def test_postgres_crash_restart_mid_run(own_pg: PostgresServer, queue_name: str, tmp_path: Path) -> None:
    roles = Roles.on(own_pg.dsn, queue_name, tmp_path)
    start_roles(roles)
    async with roles.all_stay_up():
        ids = await submit_some(own_pg.dsn, queue_name, 150)
        own_pg.crash()
        await asyncio.sleep(1.0)  # the outage lasts a second
        own_pg.start()
        ids += await submit_some(own_pg.dsn, queue_name, 150)
        statuses = await wait_all_terminal(own_pg.dsn, ids, within=60, roles=roles)
        assert set(statuses.values()) == {"ACCEPTED"}


async def test_redis_killed_and_restarted_with_aof(pg_dsn: str, queue_name: str, tmp_path: Path) -> None:
    async with _pg_queue(pg_dsn, queue_name):
        pass
    with redis_server("--appendonly", "yes", "--appendfsync", "always") as first, contextlib.ExitStack() as later:
        roles = Roles.on(pg_dsn, queue_name, tmp_path, redis_url=first.url)
        start_roles(roles)
        async with roles.all_stay_up():
            ids = await submit_some(pg_dsn, queue_name, 150)
            first.process.kill()  # SIGKILL: only what the AOF holds survives
            first.process.wait()
            await asyncio.sleep(1.0)  # the outage lasts a second
            restarted = RedisServer(first.port, first.workdir, ["--appendonly", "yes", "--appendfsync", "always"])
            later.callback(restarted.stop)  # after the roles stopped
            ids += await submit_some(pg_dsn, queue_name, 150)
            statuses = await wait_all_terminal(pg_dsn, ids, within=60, roles=roles)
            assert set(statuses.values()) == {"ACCEPTED"}


async def test_connections_cut_and_stalled_by_a_proxy(pg_dsn: str, queue_name: str, tmp_path: Path) -> None:
    async with _pg_queue(pg_dsn, queue_name):
        pass
    pg_port = int(pg_dsn.rsplit(":", 1)[1].split("/", 1)[0])
    db = pg_dsn.rsplit("/", 1)[1]
    redis_port = int(REDIS_URL.rsplit(":", 1)[1].split("/", 1)[0])
    pg_proxy, redis_proxy = TcpProxy(pg_port), TcpProxy(redis_port)
    await pg_proxy.start()
    await redis_proxy.start()
    roles = Roles.on(
        f"postgresql://postgres@127.0.0.1:{pg_proxy.port}/{db}",
        queue_name,
        tmp_path,
        redis_url=f"redis://127.0.0.1:{redis_proxy.port}/0",
    )
    start_roles(roles)
    try:
        ids: list[int] = []
        for round_ in range(4):
            ids += await submit_some(pg_dsn, queue_name, 50)
            if round_ % 2 == 0:
                pg_proxy.cut()
                redis_proxy.cut()
            else:
                pg_proxy.stall(True)
                redis_proxy.stall(True)
                await asyncio.sleep(1.5)  # the stall lasts 1.5 s
                pg_proxy.stall(False)
                redis_proxy.stall(False)
        statuses = await wait_all_terminal(pg_dsn, ids, within=90, roles=roles)
        assert set(statuses.values()) == {"ACCEPTED"}
        assert roles.alive() == 4, roles.logs()
    finally:
        # Stop in a thread: the proxies live on this event loop and must keep forwarding meanwhile.
        codes = await asyncio.to_thread(roles.stop)
        await pg_proxy.close()
        await redis_proxy.close()
    assert codes == [0, 0, 0, 0], roles.logs()


class _pg_queue:
    def __init__(self, dsn: str, queue: str) -> None:
        self.dsn, self.queue = dsn, queue

    async def __aenter__(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        await create_queue(conn, self.queue)
        await conn.close()

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_redis_restarted_without_persistence_recovers_from_the_outbox(
    pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    """The stream, its group and every dedup marker are gone; the outbox still holds the intent."""
    async with _pg_queue(pg_dsn, queue_name):
        pass
    with redis_server() as first, contextlib.ExitStack() as later:
        roles = Roles.on(pg_dsn, queue_name, tmp_path, redis_url=first.url, JUDGEQUEUE_REDISPATCH_AFTER="3s")
        roles.start("dispatcher")
        roles.start("reaper")
        async with roles.all_stay_up():
            # Sent while no worker runs: every delivery sits in the stream when Redis dies.
            ids = await submit_some(pg_dsn, queue_name, 100)
            await _wait_sent(pg_dsn, len(ids))
            first.process.kill()
            first.process.wait()
            restarted = RedisServer(first.port, first.workdir)  # empty: no AOF, no RDB
            later.callback(restarted.stop)  # after the roles stopped
            roles.start("worker", 2)
            ids += await submit_some(pg_dsn, queue_name, 50)
            statuses = await wait_all_terminal(pg_dsn, ids, within=60, roles=roles)
            assert set(statuses.values()) == {"ACCEPTED"}
            # Counted from the reaper's own report: an outbox row's last_error may since say why a
            # later send attempt failed (Redis still starting), which is not a missing re-send.
            resent = sum(
                int(event.get("count", 0))
                for event in roles.events("reaper")
                if event.get("msg") == "stranded deliveries re-sent"
            )
            assert resent >= 100, "the lost deliveries were re-sent from the outbox"


async def _wait_sent(dsn: str, n: int) -> None:
    async with connection(dsn) as conn:

        async def sent() -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state = 'SENT'") >= n)

        await eventually(sent, within=30, what=f"{n} rows sent")
