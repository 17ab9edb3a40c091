"""Redis failover under Sentinel: a master, one replica and three ``redis-sentinel``s; the master is
SIGKILLed while jobs flow, with writes it never passed to the replica. Roles hold a
``redis+sentinel://`` URL and must follow the promoted replica on their own; the deliveries lost
with the old master are re-sent from the outbox (the reaper's stranded-delivery path), and every
committed submission ends with exactly one verdict.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from judgequeue.core.store.queues import create_queue
from judgequeue.core.transport.connect import SentinelMaster, redis_client
from tests.support.databases import connection
from tests.support.flow import Flow, check_flow, install_audit, terminal_count
from tests.support.redis_servers import (
    RedisServer,
    free_port,
    master_address,
    start_sentinel,
    wait_sentinels_settled,
)
from tests.support.roles import Roles
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually

MASTER = "judgemaster"


@dataclass
class SentinelGroup:
    master: RedisServer
    replica: RedisServer
    sentinels: list[RedisServer]
    link: TcpProxy  # the replication link, master -> replica, which the test can stall and cut

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"


@pytest.fixture
async def sentinel_group() -> AsyncIterator[SentinelGroup]:
    with tempfile.TemporaryDirectory(prefix="jq-sentinel-") as tmp:
        servers: list[RedisServer] = []
        link: TcpProxy | None = None
        try:
            master = RedisServer(free_port(), Path(tmp) / "master")
            servers.append(master)
            link = TcpProxy(master.port)
            await link.start()
            replica = RedisServer(free_port(), Path(tmp) / "replica", ["--replicaof", "127.0.0.1", str(link.port)])
            servers.append(replica)

            async def linked() -> bool:
                with replica.client() as c:
                    return bool(c.info("replication").get("master_link_status") == "up")

            await eventually(linked, within=20, what="replica linked to the master")
            sentinels = [start_sentinel(Path(tmp) / f"sentinel{i}", MASTER, master.port) for i in range(3)]
            servers.extend(sentinels)
            await asyncio.to_thread(wait_sentinels_settled, sentinels, MASTER, 1)
            yield SentinelGroup(master, replica, sentinels, link)
        finally:
            for server in servers:
                server.stop()
            if link is not None:
                await link.close()


async def test_roles_follow_the_promoted_replica_and_resend_what_was_lost(
    sentinel_group: SentinelGroup, pg_dsn: str, queue_name: str, tmp_path: Path
) -> None:
    group = sentinel_group
    await install_audit(pg_dsn)
    async with connection(pg_dsn) as conn:
        await create_queue(conn, queue_name)
    roles = Roles.on(
        pg_dsn, queue_name, tmp_path, redis_url=group.url, JUDGEQUEUE_CONCURRENCY="8", JUDGEQUEUE_REDISPATCH_AFTER="3s"
    )
    roles.start("dispatcher")
    workers = roles.start("worker", 2)
    roles.start("reaper")
    try:
        flow = Flow(pg_dsn, queue_name, submitters=3, job_seconds=(0.05, 0.3))

        await flow.wait_verdicts(100, what="verdicts before the failover")

        await flow.wait_judging(5)  # stopped with their workers below

        # The asynchronous replication window, made certain: the replica stops receiving, the
        # workers stop consuming, and the dispatcher keeps appending to the master alone.
        group.link.stall(True)
        for worker in workers:
            worker.send_signal(signal.SIGSTOP)
        sent_before = await _sent(pg_dsn)

        async def appended_unreplicated() -> bool:
            return await _sent(pg_dsn) >= sent_before + 20

        await eventually(appended_unreplicated, within=30, what="20 deliveries only the master holds")
        killed = time.monotonic()
        group.master.process.kill()
        group.master.process.wait()
        group.link.cut()
        for worker in workers:
            worker.send_signal(signal.SIGCONT)

        async def promoted() -> bool:
            return await asyncio.to_thread(master_address, group.sentinels[0], MASTER) == (
                "127.0.0.1",
                group.replica.port,
            )

        await eventually(promoted, within=60, what="the sentinels promoting the replica")
        promoted_after = time.monotonic() - killed

        async def followed() -> bool:
            after = flow.committed_after(killed + promoted_after)
            return bool(after) and await terminal_count(pg_dsn, after) > 0

        await eventually(followed, within=60, what="a submission committed after the promotion judged")
        follow = time.monotonic() - killed - promoted_after
        before = len(flow.expected)
        await flow.wait_verdicts(before + 100, what="verdicts (100 more after the failover)")
        expected = await flow.stop()
        report = await check_flow(pg_dsn, group.url, queue_name, expected, roles, within=90)
        resent = await _resent(pg_dsn)
        print(
            f"redis failover: master killed to replica promoted {promoted_after:.2f}s, promoted to first "
            f"verdict of a new submission {follow:.2f}s; {len(expected)} submissions, lost "
            f"{report.lost_submissions}, deliveries re-sent from the outbox {resent}"
        )
        assert report.violations == [], report.violations
        # A worker's read blocked before SIGSTOP may still be served a few of the 20 (the reply waits in
        # its socket): those are leased when it resumes, the others can only come back by re-sending.
        assert resent > 0, "the deliveries lost with the old master were re-sent"
        assert roles.alive() == 4, "roles follow the new master instead of exiting\n" + roles.logs()
    finally:
        for proc in roles.procs:  # never leave a stopped worker behind
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        codes = await asyncio.to_thread(roles.stop)
    assert codes == [0] * 4, roles.logs()


async def _sent(dsn: str) -> int:
    async with connection(dsn) as conn:
        return int(await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE state = 'SENT'"))


async def _resent(dsn: str) -> int:
    async with connection(dsn) as conn:
        return int(await conn.fetchval("SELECT count(*) FROM judgequeue.outbox WHERE last_error LIKE 're-sent%'"))


async def test_the_sentinel_client_finds_the_master_and_closes_everything(sentinel_group: SentinelGroup) -> None:
    client = redis_client(sentinel_group.url, socket_timeout=5)
    await client.set("jq:{sentinel-test}:k", "v")
    with sentinel_group.master.client() as direct:
        assert direct.get("jq:{sentinel-test}:k") == b"v"  # it asked a sentinel and wrote to the master
    assert isinstance(client, SentinelMaster) and client.sentinel_manager is not None

    def open_to_sentinels() -> int:
        assert isinstance(client, SentinelMaster) and client.sentinel_manager is not None
        pools = [s.connection_pool for s in client.sentinel_manager.sentinels]
        return sum(1 for p in pools for c in [*p._available_connections, *p._in_use_connections] if c.is_connected)

    assert open_to_sentinels() >= 1
    await client.aclose()
    assert open_to_sentinels() == 0
