"""A worker whose sandbox directory is removed under it (a pod's emptyDir cleaned while its container
still runs, a /tmp sweeper) gives its jobs back and exits naming why, instead of storing a
SYSTEM_ERROR for every submission it can no longer judge; a fresh worker then judges them.

Seen on a real node: after a forced pod deletion and a kubelet restart, one worker wrote 38
SYSTEM_ERROR verdicts ("judge raised FileNotFoundError ... /tmp/judgequeue-sandbox/staging/0/15").
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import connection
from tests.support.queries import submission
from tests.support.roles import Roles, submit_retrying, wait_all_terminal
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("as_root")

SUM = {
    "language": "python",
    "source": "a, b = map(int, input().split())\nprint(a + b)\n",
    "tests": [{"input": "1 2", "output": "3"}],
}


@pytest.fixture
def own_sandbox() -> Iterator[str]:
    path = f"/tmp/jq-unfit-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("removed", ["", "locks"], ids=["the sandbox", "its uid range's lock"])
async def test_a_worker_whose_sandbox_vanishes_gives_its_jobs_back_and_exits(
    pg_dsn: str, queue: str, own_sandbox: str, tmp_path: Path, removed: str
) -> None:
    """Whatever verdict the judge then reports: with only the lock gone the programs still run and
    pass, and on a real node an emptied box read as a RUNTIME_ERROR ("can't open file
    '/box/main.py'"); neither may be stored."""
    roles = Roles.on(pg_dsn, queue, tmp_path, JUDGEQUEUE_JUDGE="program", JUDGEQUEUE_SANDBOX_DIR=own_sandbox)
    try:
        roles.start("dispatcher")
        [worker] = roles.start("worker")
        roles.start("reaper")  # a lease taken as the worker stopped expires and is rescued
        first = await submit_retrying(pg_dsn, queue, SUM)
        assert await wait_all_terminal(pg_dsn, [first], within=60, roles=roles) == {first: "ACCEPTED"}

        shutil.rmtree(os.path.join(own_sandbox, removed))  # what the kubelet did to the pod's /tmp
        ids = [await submit_retrying(pg_dsn, queue, SUM) for _ in range(3)]

        async def exited() -> bool:
            return worker.poll() is not None

        await eventually(exited, within=60, what="the unfit worker to exit")
        assert worker.returncode == 1, worker.log()
        errors = [e for e in worker.events() if e.get("level") == "ERROR"]
        assert errors and "was removed while the worker ran" in errors[-1]["msg"], worker.log()
        assert own_sandbox in errors[-1]["msg"]
        async with connection(pg_dsn) as conn:
            rows = [await submission(conn, i) for i in ids]
        assert all(r["status"] in ("PENDING", "JUDGING") for r in rows), [dict(r) for r in rows]

        roles.start("worker")  # the container restarted: a fresh sandbox directory
        statuses = await wait_all_terminal(pg_dsn, ids, within=90, roles=roles)
        assert statuses == dict.fromkeys(ids, "ACCEPTED"), roles.logs()
    finally:
        codes = roles.stop()
    assert codes == [0, 1, 0, 0], roles.logs()
