"""Earlier versions' databases and roles upgraded under load: one ``judgequeue migrate``, then this
version's roles in place of the old ones, and every submission ends with exactly one verdict.

For each version in :data:`EARLIER`, from the oldest schema whose roles all run (0003) to 0010, the
database is made by that commit's own ``judgequeue migrate`` and its queue by its own CLI; its
dispatchers, workers and reaper (its tree first on ``PYTHONPATH``, as its image would run them)
judge a flow of submissions. While they do, with jobs in flight, this version's ``judgequeue
migrate`` takes the database to the current schema in one run; the old roles go on judging on it.
Then this version's roles start, and once they are ready the old ones are killed (SIGKILL: their
leases and stream entries are left for the reaper). The flow goes on throughout; at the end DESIGN
section 9 is checked with the chaos audit: no submission lost, one terminal verdict each (the one
asked for), no stale or repeated write, nothing left behind.

The older schemas had no whole deployment to put under load: at 0001 a dispatcher alone (and
2d16aca's ``judgequeue`` did nothing: 78b3575's is the first ``migrate``), at 0001 and 0003 no
reaper. ``tests/integration/test_schema.py`` upgrades their databases, and these, without load.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from judgequeue.core.store.migrate import applied_versions, current_versions
from tests.support.databases import REDIS_URL, connection
from tests.support.flow import Flow, check_flow, install_audit, terminal_count
from tests.support.revisions import migrate_as, ref_tree
from tests.support.roles import Roles, clean_env, http_get, run_cli
from tests.support.waiting import eventually

#: The migration that brought shadow verdicts, which the chaos audit records too where they exist.
SHADOW_VERDICTS = 12


@dataclass(frozen=True)
class Earlier:
    """A commit of main whose database and roles are upgraded, and what it lacks of this version.

    Its CLI creates a queue as this one's does (``queue create NAME``) and its roles take the fast
    preset's variables: what differs between the versions here is the schema alone.
    """

    commit: str
    #: The last migration its ``judgequeue migrate`` records (it records every one up to it).
    schema: int
    lacks: str

    @property
    def shadow_verdicts(self) -> bool:
        return self.schema >= SHADOW_VERDICTS


EARLIER = (
    Earlier("c59573f", 3, "the first with a dispatcher, a worker and a reaper: stream intake alone, before stranded "
            "re-sends, limit verdicts, problem packages, PRESENTATION_ERROR, retention, direct intake and offers"),
    Earlier("94f4a53", 10, "direct intake and offers, before queue owners, shadow judging and deferred calls"),
)  # fmt: skip


@pytest.mark.parametrize("earlier", EARLIER, ids=[f"{e.commit} at {e.schema:04d}" for e in EARLIER])
async def test_an_earlier_versions_database_and_roles_upgrade_under_load_with_one_migrate(
    fresh_db: str, queue_name: str, redis_client: aioredis.Redis, tmp_path: Path, earlier: Earlier
) -> None:
    tree = ref_tree(earlier.commit)
    await asyncio.to_thread(migrate_as, fresh_db, tree)
    async with connection(fresh_db) as conn:
        held = await applied_versions(conn)
    assert held == current_versions()[: earlier.schema], f"{earlier.commit}'s migrate left {held}"
    earlier_cli = clean_env(PYTHONPATH=tree, JUDGEQUEUE_POSTGRES_DSN=fresh_db)
    created = await asyncio.to_thread(run_cli, "queue", "create", queue_name, env=earlier_cli)
    assert created.returncode == 0, created.stderr
    await install_audit(fresh_db, shadow=earlier.shadow_verdicts)

    (tmp_path / "earlier").mkdir()
    (tmp_path / "current").mkdir()
    earlier_roles = Roles.on(fresh_db, queue_name, tmp_path / "earlier", PYTHONPATH=tree, JUDGEQUEUE_CONCURRENCY="4")
    # INFO: the line a role logs its port with (read below to wait until each is ready).
    current = Roles.on(
        fresh_db, queue_name, tmp_path / "current", JUDGEQUEUE_CONCURRENCY="4", JUDGEQUEUE_LOG_LEVEL="INFO"
    )
    earlier_roles.start_all(dispatchers=2, workers=2, reapers=1)
    flow = Flow(fresh_db, queue_name, submitters=3, job_seconds=(0.05, 0.3))
    try:
        await flow.wait_verdicts(50, what="verdicts by the earlier version's roles")
        await flow.wait_judging(2)

        # This version's migrate, once, with the earlier roles serving and jobs in flight.
        before = len(flow.expected)
        started = time.monotonic()
        this_cli = clean_env(JUDGEQUEUE_POSTGRES_DSN=fresh_db)
        migrated = await asyncio.to_thread(run_cli, "migrate", "--json", env=this_cli)
        migrated_at = time.monotonic()
        assert migrated.returncode == 0, migrated.stderr
        assert json.loads(migrated.stdout) == {
            "applied": current_versions()[earlier.schema :],
            "versions": current_versions(),
        }
        assert earlier_roles.alive() == len(earlier_roles.procs), earlier_roles.logs()
        assert len(flow.expected) > before, "submissions went on committing while migrate ran"

        async def earlier_roles_judge_on_the_new_schema() -> bool:
            after = flow.committed_after(migrated_at)
            return len(after) >= 20 and await terminal_count(fresh_db, after) >= 20

        await eventually(earlier_roles_judge_on_the_new_schema, within=60, what="20 verdicts of later submissions")

        async with current.all_stay_up():
            current.start_all(dispatchers=2, workers=2, reapers=1)
            for proc in current.procs:
                port = await asyncio.to_thread(proc.port)

                def ready(port: int = port) -> bool:
                    return http_get(port, "/readyz")[0] == 200

                await eventually(ready, within=30, what=f"this version's {proc.role} ready")
            await flow.wait_judging(2)
            assert earlier_roles.alive() == len(earlier_roles.procs), earlier_roles.logs()
            for proc in earlier_roles.procs:  # replaced, as a rollout whose old pods die without a goodbye
                proc.kill()
                proc.wait()
            killed = len(flow.expected)
            await flow.wait_verdicts(killed + 100, what="verdicts by this version's roles alone")
            expected = await flow.stop()
            report = await check_flow(fresh_db, REDIS_URL, queue_name, expected, current)
    finally:
        await flow.stop()
        for proc in earlier_roles.procs:
            proc.ensure_dead()
    print(
        f"upgrade from {earlier.commit} (schema {earlier.schema:04d}) under load: migrate took "
        f"{migrated_at - started:.2f}s; {len(expected)} "
        f"submissions ({before} before the migration, {killed} before the old roles were killed), "
        f"re-executions {report.duplicate_executions}, generation bumps {report.generation_bumps}, "
        f"system errors {report.system_errors}"
    )
    assert report.violations == [], report.violations
    assert report.lost_submissions == report.multiple_terminal_verdicts == report.stale_writes_accepted == 0
    assert report.wrong_verdicts == 0
