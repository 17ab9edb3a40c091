"""SIGTERM while the network to a server is stalled: a partition, connections open and nothing answers.

The server-fault chaos (``tests/chaos.py``) stops its roles after the faults; these tests stop them
during one. Each role must exit 0 while the stall is still on: a shutdown that waits for the network
to come back is, in a long partition, a SIGKILL at the end of the grace period instead.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from judgequeue.core.config import INTAKES
from judgequeue.core.store.queues import create_queue
from tests.support.chaos import FaultTargets, fault_targets
from tests.support.databases import connection
from tests.support.roles import Roles, submit_retrying, wait_all_terminal
from tests.support.tcp_proxy import TcpProxy

OK = {"seconds": 0.05, "status": "ACCEPTED"}
NAMES = ["dispatcher", "worker", "worker", "reaper"]


async def _exit_codes_while_stalled(
    t: FaultTargets, proxy: TcpProxy, queue: str, tmp_path: Path, within: float, intake: str
) -> dict[str, int | None]:
    """Start the roles through the proxies, let them judge, stall ``proxy``, SIGTERM every role and
    return each role's exit code, or None for a role still running ``within`` seconds later."""
    async with connection(t.pg.dsn) as conn:
        await create_queue(conn, queue)
    roles = Roles.on(t.role_pg_dsn, queue, tmp_path, redis_url=t.role_redis_url, JUDGEQUEUE_INTAKE=intake)
    roles.start_all(workers=2)
    try:
        ids = [await submit_retrying(t.pg.dsn, queue, OK) for _ in range(30)]
        await wait_all_terminal(t.pg.dsn, ids, within=60, roles=roles)
        # Work in flight when the network stalls: leases held, verdicts to write, entries to ack.
        for _ in range(20):
            await submit_retrying(t.pg.dsn, queue, OK)
        proxy.stall(True)
        await asyncio.sleep(1.0)  # the stall has lasted a second when SIGTERM comes: every role is stuck in it
        for proc in roles.procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + within
        while True:
            if all(p.poll() is not None for p in roles.procs) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)  # the proxies run on this loop: poll, never block it
        codes = {f"{NAMES[i]}-{i}": p.poll() for i, p in enumerate(roles.procs)}
        if any(c != 0 for c in codes.values()):
            print(roles.logs())  # shown by pytest when the assertion below fails
            for p in roles.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGUSR1)
            await asyncio.sleep(0.5)
            print(roles.logs())
        return codes
    finally:
        proxy.stall(False)
        await asyncio.to_thread(roles.stop)


@pytest.mark.parametrize("intake", INTAKES)
async def test_sigterm_during_a_redis_stall_exits_0_before_the_stall_ends(
    queue_name: str, tmp_path: Path, intake: str
) -> None:
    """Every Redis call a role is in gives up after redis-py's socket timeout; a reaper sweep stops
    starting new steps once asked to stop (it used to run all of them, one timeout each)."""
    async with fault_targets() as t:
        codes = await _exit_codes_while_stalled(t, t.redis_proxy, queue_name, tmp_path, within=10, intake=intake)
    assert codes == {"dispatcher-0": 0, "worker-1": 0, "worker-2": 0, "reaper-3": 0}, codes


@pytest.mark.parametrize("intake", INTAKES)
async def test_sigterm_during_a_postgres_stall_exits_0_before_the_stall_ends(
    queue_name: str, tmp_path: Path, intake: str
) -> None:
    """A direct-intake worker's step (a take, a LISTEN, an offers sync, a connect) is abandoned at
    SIGTERM like the stream read: its half-done work is a crash's leftover, rescued."""
    async with fault_targets() as t:
        codes = await _exit_codes_while_stalled(t, t.pg_proxy, queue_name, tmp_path, within=10, intake=intake)
    assert codes == {"dispatcher-0": 0, "worker-1": 0, "worker-2": 0, "reaper-3": 0}, codes
