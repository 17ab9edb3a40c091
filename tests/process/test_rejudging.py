"""A rejudging of 2,000 submissions while a contest's live jobs flow, the roles as processes.

The organiser fixes a problem's tests and previews a rejudge of its 2,000 submissions from the CLI
(``judgequeue rejudge --preview``) while contest jobs keep arriving; a worker is SIGKILLed
mid-preview and replaced. Then:

- every previewed submission ends with exactly one proposed verdict (from an audit of every status
  change of the probes), some of them judged again after the kill (rescued);
- no visible status, verdict or generation changed during the preview;
- ``judgequeue rejudging show --json`` gives the exact old -> new matrix;
- apply is atomic: a concurrent reader, reading every previewed submission's generation in one
  snapshot again and again, sees all old or all new, never a mix;
- a second preview cancelled mid-way leaves every visible verdict as it was;
- every live job is judged, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from judgequeue.core import api
from judgequeue.core.base.classes import JobClass
from judgequeue.core.store.queues import create_queue, set_classes
from tests.support.chaos import VERDICT_AUDIT_SQL
from tests.support.roles import Roles, clean_env, role_env, run_cli
from tests.support.waiting import eventually

SUBMISSIONS = 2000
#: Each job sleeps this long (the sleep judge): a worker holds leases when it is killed.
JOB_SECONDS = 0.01
#: A judging with the fixed tests (a probe's).
PROBE_SECONDS = 0.04
#: What the broken tests gave, by i % 4; the fixed tests change some (``_fixed``).
OLD = ("ACCEPTED", "WRONG_ANSWER", "TIME_LIMIT", "ACCEPTED")
LIVE_PER_TICK = 10
LIVE_TICK = 0.1


def _fixed(i: int) -> str:
    """The verdict submission i gets with the fixed tests."""
    if i % 5 == 0:
        return "ACCEPTED"
    if i % 7 == 0:
        return "WRONG_ANSWER"
    return OLD[i % 4]


async def _count(pg: asyncpg.Connection, sql: str, *args: object) -> int:
    return int(await pg.fetchval(sql, *args))


async def _visible(pg: asyncpg.Connection, ids: list[int]) -> dict[int, tuple[str, int, str]]:
    rows = await pg.fetch(
        "SELECT id, status, generation, verdict::text AS verdict FROM judgequeue.submissions"
        " WHERE id = ANY($1::bigint[])", ids,
    )  # fmt: skip
    return {r["id"]: (r["status"], r["generation"], r["verdict"]) for r in rows}


async def _live_flow(pool: asyncpg.Pool, queue: str, stop: asyncio.Event, live: list[int]) -> None:
    """Contest jobs arriving steadily until ``stop``."""
    n = 0
    while not stop.is_set():
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT judgequeue.submit($1, jsonb_build_object('live', g, 'seconds', $3::float8), 'contest', NULL)"
                " AS id FROM generate_series($2::int, $2::int + $4 - 1) AS g",
                queue, n, JOB_SECONDS, LIVE_PER_TICK,
            )  # fmt: skip
        live += [r["id"] for r in rows]
        n += LIVE_PER_TICK
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), LIVE_TICK)


async def _judged(pg: asyncpg.Connection, n: int) -> bool:
    """True once rejudging ``n`` has every proposed verdict."""
    row = await pg.fetchrow(
        "SELECT count(*) AS items, count(*) FILTER (WHERE p.status = ANY (judgequeue.verdict_names())) AS judged"
        " FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe WHERE i.rejudging = $1",
        n,
    )
    assert row is not None
    return bool(row["items"] == row["judged"] == SUBMISSIONS)


async def _judged_count(pg: asyncpg.Connection, n: int) -> int:
    return await _count(
        pg, "SELECT count(*) FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe"
        " WHERE i.rejudging = $1 AND p.status = ANY (judgequeue.verdict_names())", n,
    )  # fmt: skip


@pytest.mark.slow
async def test_a_rejudging_of_2000_while_live_jobs_flow(
    pg: asyncpg.Connection, pg_dsn: str, pg_pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    begun = time.monotonic()
    await create_queue(pg, queue_name)
    await set_classes(pg, queue_name, (JobClass("contest"), JobClass("rejudge", 20)))
    await pg.execute(VERDICT_AUDIT_SQL)
    rows = await pg.fetch(
        "SELECT judgequeue.submit($1, jsonb_build_object('problem', 'p', 'i', g, 'seconds', $3::float8,"
        " 'status', ($4::text[])[g % 4 + 1]), 'contest', NULL) AS id FROM generate_series(0, $2 - 1) AS g ORDER BY g",
        queue_name, SUBMISSIONS, JOB_SECONDS, list(OLD),
    )  # fmt: skip
    ids = [r["id"] for r in rows]
    index = {sid: i for i, sid in enumerate(ids)}
    roles = Roles.on(pg_dsn, queue_name, tmp_path, JUDGEQUEUE_CONCURRENCY="8")
    cli_env = clean_env(**role_env(pg_dsn, queue_name))
    stop_live = asyncio.Event()
    live: list[int] = []
    flow: asyncio.Task[None] | None = None
    try:
        roles.start_all(dispatchers=1, workers=2, reapers=1)
        judged_first = (
            "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1::bigint[])"
            " AND status <> 'PENDING' AND status <> 'JUDGING'"
        )
        await eventually(lambda: _at_least(pg, judged_first, SUBMISSIONS, ids), within=120, every=0.2,
                         what="the first judging")  # fmt: skip
        # The tests are fixed: judged again, some verdicts change (and each judging takes a little
        # longer, so the worker killed below holds several probes' leases).
        await pg.execute(
            "UPDATE judgequeue.submissions s"
            " SET payload = s.payload || jsonb_build_object('status', f.status, 'seconds', $3::float8)"
            " FROM unnest($1::bigint[], $2::text[]) AS f(id, status) WHERE s.id = f.id",
            ids, [_fixed(i) for i in range(SUBMISSIONS)], PROBE_SECONDS,
        )  # fmt: skip
        before = await _visible(pg, ids)
        assert Counter(v[0] for v in before.values()) == Counter(OLD[i % 4] for i in range(SUBMISSIONS))
        flow = asyncio.create_task(_live_flow(pg_pool, queue_name, stop_live, live))
        await eventually(lambda: len(live) >= 50, what="live jobs flowing")

        preview_started = time.monotonic()
        out = await asyncio.to_thread(run_cli, "rejudge", "--preview", "--problem", "p", "--json", env=cli_env)
        assert out.returncode == 0, out.stderr
        opened = json.loads(out.stdout)
        n = opened["rejudging"]
        assert (opened["previewed"], opened["left_out"]) == (SUBMISSIONS, 0)

        # A worker killed with its probes' leases held, and replaced.
        await eventually(lambda: _at_least_judged(pg, n, SUBMISSIONS // 3), within=60, every=0.1,
                         what="a third of the proposals judged")  # fmt: skip
        victim = next(p for p in roles.procs if p.role == "worker")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        roles.start("worker")
        await eventually(lambda: _judged(pg, n), within=90, every=0.2, what="every proposal judged")
        preview_seconds = time.monotonic() - preview_started
        # Nothing visible moved while it was judged on the side.
        assert await _visible(pg, ids) == before

        # Each previewed submission has exactly one proposed verdict: one probe, one verdict stored.
        per_probe = await pg.fetch(
            "SELECT i.submission_id, max(p.generation) AS generation,"
            " count(a.seq) FILTER (WHERE a.new_status = ANY (judgequeue.verdict_names())) AS verdicts"
            " FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe"
            " LEFT JOIN public.chaos_audit a ON a.submission = i.probe"
            " WHERE i.rejudging = $1 GROUP BY i.submission_id", n,
        )  # fmt: skip
        assert len(per_probe) == SUBMISSIONS
        assert [r["submission_id"] for r in per_probe if r["verdicts"] != 1] == []
        rescued = sum(1 for r in per_probe if r["generation"] > 1)
        assert rescued >= 1, "the killed worker held no probe's lease: nothing was rescued"

        # The matrix, exact, from the CLI.
        out = await asyncio.to_thread(run_cli, "rejudging", "show", str(n), "--json", env=cli_env)
        assert out.returncode == 0, out.stderr
        shown = json.loads(out.stdout)
        expected = Counter((OLD[i % 4], _fixed(i)) for i in range(SUBMISSIONS))
        assert {(m["old"], m["new"]): m["count"] for m in shown["matrix"]} == dict(expected)
        changed = {c["id"] for c in shown["changed"]}
        assert changed == {sid for sid in ids if OLD[index[sid] % 4] != _fixed(index[sid])}
        assert all(c["old_verdict"]["details"] is not None and c["new_verdict"]["details"] is not None
                   for c in shown["changed"])  # fmt: skip

        # Apply, watched by a reader that reads all 2,000 generations in one snapshot each time.
        mixes: list[tuple[int, int]] = []
        reads: Counter[str] = Counter()
        applying = asyncio.Event()
        applied = asyncio.Event()

        async def reader() -> None:
            async with pg_pool.acquire() as conn:
                while True:
                    done, during = applied.is_set(), applying.is_set() and not applied.is_set()
                    row = await conn.fetchrow(
                        "SELECT count(*) FILTER (WHERE s.generation = i.base_generation) AS old,"
                        " count(*) FILTER (WHERE s.generation = i.base_generation + 1) AS new"
                        " FROM judgequeue.rejudging_items i JOIN judgequeue.submissions s ON s.id = i.submission_id"
                        " WHERE i.rejudging = $1", n,
                    )  # fmt: skip
                    assert row is not None
                    pair = (int(row["old"]), int(row["new"]))
                    if pair == (SUBMISSIONS, 0):
                        reads["old"] += 1
                    elif pair == (0, SUBMISSIONS):
                        reads["new"] += 1
                    else:
                        mixes.append(pair)
                    if during:
                        reads["during"] += 1
                    if done:
                        return

        watching = asyncio.create_task(reader())
        await eventually(lambda: reads["old"] >= 3, what="the reader reading")
        apply_started = time.monotonic()
        applying.set()
        async with pg_pool.acquire() as conn, conn.transaction():
            result = await api.rejudging_apply(conn, queue_name, n)
        apply_seconds = time.monotonic() - apply_started
        applied.set()
        await watching
        assert mixes == [], mixes[:5]
        assert reads["old"] >= 3 and reads["new"] >= 1 and reads["during"] >= 1, reads
        assert (result.applied, result.stale, result.missing) == (SUBMISSIONS, 0, 0)
        after = await _visible(pg, ids)
        assert Counter(v[0] for v in after.values()) == Counter(_fixed(i) for i in range(SUBMISSIONS))
        assert all(after[sid][1] == before[sid][1] + 1 for sid in ids)

        # A second preview, cancelled mid-way: every visible verdict stays as the apply left it.
        out = await asyncio.to_thread(run_cli, "rejudge", "--preview", "--problem", "p", "--json", env=cli_env)
        assert out.returncode == 0, out.stderr
        second = json.loads(out.stdout)["rejudging"]
        await eventually(lambda: _at_least_judged(pg, second, 100), within=60, every=0.05,
                         what="some of the second preview judged")  # fmt: skip
        out = await asyncio.to_thread(run_cli, "rejudging", "cancel", str(second), "--json", env=cli_env)
        assert out.returncode == 0, out.stderr
        stopped = json.loads(out.stdout)["stopped"]
        settled = (
            "SELECT count(*) FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe"
            " WHERE i.rejudging = $1 AND p.status NOT IN ('PENDING', 'JUDGING')"
        )
        await eventually(lambda: _at_least(pg, settled, SUBMISSIONS, second), within=30, every=0.1,
                         what="every probe of the cancelled rejudging ended")  # fmt: skip
        assert await _visible(pg, ids) == after
        cancelled = await _count(pg, "SELECT count(*) FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p"
                                 " ON p.id = i.probe WHERE i.rejudging = $1 AND p.status = 'CANCELLED'", second)
        assert cancelled == stopped

        stop_live.set()
        await flow
        flow = None
        await eventually(
            lambda: _at_least(pg, "SELECT count(*) FROM judgequeue.submissions WHERE id = ANY($1::bigint[])"
                              " AND status = 'ACCEPTED'", len(live), live),
            within=60, every=0.2, what="every live job judged",
        )  # fmt: skip
        twice = await _count(pg, "SELECT count(*) FROM (SELECT submission FROM public.chaos_audit"
                             " WHERE submission = ANY($1::bigint[]) AND new_status = 'ACCEPTED'"
                             " GROUP BY submission, new_gen HAVING count(*) > 1) x", live)  # fmt: skip
        assert twice == 0
    finally:
        stop_live.set()
        if flow is not None:
            await flow
        roles.stop()
    print(
        f"\n{SUBMISSIONS} previewed while {len(live)} live jobs flowed: all proposals judged in"
        f" {preview_seconds:.1f} s with a worker killed ({rescued} probes rescued); apply {apply_seconds:.2f} s,"
        f" reader saw {reads['old']} all-old and {reads['new']} all-new snapshots ({reads['during']} read while"
        f" the apply ran) and no mix; the second"
        f" preview cancelled with {stopped} jobs stopped; {time.monotonic() - begun:.0f} s in all"
    )


async def _at_least(pg: asyncpg.Connection, sql: str, n: int, *args: object) -> bool:
    return await _count(pg, sql, *args) >= n


async def _at_least_judged(pg: asyncpg.Connection, rejudging: int, n: int) -> bool:
    return await _judged_count(pg, rejudging) >= n
