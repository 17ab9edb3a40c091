"""CPU seconds per judged job, per process, at a fixed offered load (noop judge), beside the limits and the peer.

    .venv/bin/python -m bench.cpu [--rate 1000] [--seconds 20] [--workers 1] [--servers private|system]
                                  [--skip-peer] [--ref REV [--ref-intake direct] [--rounds N]] [--per-role]
                                  [--out bench/out]

By default the run starts a private Postgres cluster (pg_stat_statements preloaded) and Redis
server (``bench.servers``), so their CPU is this benchmark's alone on a shared machine. In one run:

1. **limits**: pgbench's raw two-insert transaction (8 clients, ``--limit-seconds``), with the
   cluster's and pgbench's CPU per transaction; redis-benchmark pipelined XADD;
2. **judgequeue**: dispatcher, ``--workers`` workers and a reaper as real processes; an application
   process submits ``--rate`` jobs/s for ``--seconds`` (one ``submit()`` per transaction over 8
   connections, paced); CPU deltas (``/proc/<pid>/stat``) of every role, the whole Postgres cluster,
   Redis and the application from the first submit to the last verdict, divided by the jobs; and
   ``pg_stat_statements`` calls and execution time per job for each statement (named as in
   ``core/store/sql/queries.sql``);
3. **peer**: PgQueuer with the same offered load and submit side, its workers' CPU per job.

Prints the table and writes ``cpu.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench import outbox_bench, pipeline, servers
from bench.cli import DEFAULT_INTAKE, INTAKE_VARIABLE, add_run_options, new_parser, reporter, run_on_servers
from bench.common import create_database, drop_database, pgbench, redis_benchmark_xadd
from judgequeue.core.runtime.process import event_loop_factory
from judgequeue.core.store import outbox, sql
from tests.support.revisions import ref_tree

CONNECTIONS = 8
#: Jobs pushed through before the window opens (then the tables are analyzed).
WARM_UP_JOBS = 2000


progress = reporter("cpu")


# --------------------------------------------------------------------------- the application side


def paced_submit(
    kind: str,
    dsn: str,
    queue: str,
    rate: float,
    seconds: float,
    connections: int,
    payload: dict[str, Any] | None = None,
    stagger: bool = False,
) -> dict[str, Any]:
    """Run in a process of its own: the application. Returns jobs, its CPU seconds, wall time (and peer ids).

    ``payload``: what each judgequeue submit carries (``{}`` by default: the noop judge's);
    ``stagger``: spread the connections' submits evenly instead of sending them in step."""

    async def paced() -> list[int]:
        ids: list[int] = []
        total = int(rate * seconds)
        interval = connections / rate
        conns = [await asyncpg.connect(dsn) for _ in range(connections)]
        start = time.monotonic() + 0.05

        async def lane(k: int) -> None:
            conn = conns[k]
            queries: Any = None
            if kind == "pgqueuer":
                from pgqueuer import AsyncpgDriver, Queries

                queries = Queries(AsyncpgDriver(conn))
            for i in range(k, total, connections):
                # Lanes in step send ``connections`` submits at once every ``interval``; staggered,
                # one every ``interval / connections`` (what a latency against few slots needs).
                delay = start + (i / connections if stagger else i // connections) * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing of the offered load
                if queries is None:
                    await outbox.submit(conn, queue, payload or {})
                else:
                    ids.extend(await queries.enqueue("noop", None))

        try:
            await asyncio.gather(*(lane(k) for k in range(connections)))
        finally:
            for c in conns:
                await c.close()
        return ids or list(range(total))

    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        ids = runner.run(paced())
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"jobs": len(ids), "cpu_s": cpu, "wall_s": time.monotonic() - t0, "ids": ids if kind == "pgqueuer" else []}


# --------------------------------------------------------------------------- accounting


def _pids() -> tuple[int | None, int | None]:
    pm = os.environ.get("BENCH_POSTMASTER_PID")
    rp = os.environ.get("BENCH_REDIS_PID")
    return (int(pm) if pm else None, int(rp) if rp else None)


class Meter:
    """CPU snapshots of named processes, the Postgres cluster and Redis."""

    def __init__(self, procs: dict[str, list[int]]) -> None:
        self.procs = procs
        self.postmaster, self.redis = _pids()
        self.start: dict[str, float] = {}

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, pids in self.procs.items():
            out[role] = sum(servers.cpu_seconds(p) for p in pids)
        if self.postmaster:
            out["postgres"] = servers.tree_cpu_seconds(self.postmaster)
            out.update(self._postgres_by_whom(self.postmaster))
        if self.redis:
            out["redis"] = servers.cpu_seconds(self.redis)
        return out

    def _postgres_by_whom(self, postmaster: int) -> dict[str, float]:
        """The cluster's CPU split by whom it served: ``pg:<role>`` for the backends of a role's
        connections (matched by the client's port), ``pg:<kind>`` for background processes
        (walwriter, autovacuum worker, ...), ``pg:other`` for the rest: the submitting
        application's backends, backends that exited (their CPU is the postmaster's reaped
        children's) and the postmaster itself. The parts sum to ``postgres``."""
        ports = {port: role for role, pids in self.procs.items() for port in servers.tcp_local_ports(pids)}
        parts: dict[str, float] = {"pg:other": servers.cpu_seconds(postmaster, children=True)}
        for pid in servers.children_of(postmaster):
            kind, port = servers.postgres_process_kind(pid)
            whom = f"pg:{ports[port]}" if port in ports else "pg:other" if kind in ("client", "gone") else f"pg:{kind}"
            parts[whom] = parts.get(whom, 0.0) + servers.cpu_seconds(pid)
        return parts

    def begin(self) -> None:
        self.start = self.snapshot()

    def end(self) -> dict[str, float]:
        now = self.snapshot()
        return {k: now[k] - self.start.get(k, 0.0) for k in now}


class ConnectionPeaks:
    """The most Postgres client backends seen at once during a run: in all (cluster-wide, the
    figure ``max_connections`` caps) and per role (backends matched to a role by the client's
    port, as :class:`Meter` does; ``other``: the application and the harness).

    Sampled every ``interval`` seconds while :meth:`watching`; the peaks stay readable after the
    run failed, so a run that ran out of connections still reports how many it held.
    """

    def __init__(self) -> None:
        self.total = 0
        self.by_role: dict[str, int] = {}
        self.max_connections = 0

    async def sample(self, conn: asyncpg.Connection, procs: dict[str, list[int]]) -> None:
        rows = await conn.fetch("SELECT client_port FROM pg_stat_activity WHERE backend_type = 'client backend'")
        ports = {port: role for role, pids in procs.items() for port in servers.tcp_local_ports(pids)}
        counts: dict[str, int] = {}
        for r in rows:
            role = ports.get(r["client_port"], "other")
            counts[role] = counts.get(role, 0) + 1
        self.total = max(self.total, len(rows))
        for role, n in counts.items():
            self.by_role[role] = max(self.by_role.get(role, 0), n)

    @contextlib.asynccontextmanager
    async def watching(
        self, pool: asyncpg.Pool, procs: Callable[[], dict[str, list[int]]], interval: float = 0.5
    ) -> AsyncIterator[None]:
        async with pool.acquire() as conn:
            self.max_connections = int(await conn.fetchval("SELECT current_setting('max_connections')"))

        async def loop() -> None:
            while True:
                # A full cluster refuses the harness's connections too: a missed sample, not an error.
                with contextlib.suppress(asyncpg.PostgresError, OSError):
                    async with pool.acquire() as conn:
                        await self.sample(conn, procs())
                await asyncio.sleep(interval)  # the sampling period

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            # asyncio.wait, not ``await task`` under suppress(CancelledError): that would also
            # swallow a cancellation of the run itself (Ctrl-C) and carry on to the next one.
            await asyncio.wait([task])


_LITERAL = re.compile(r"'(?:[^']|'')*'|\$\d+|\b\d+(?:\.\d+)?\b|--[^\n]*")


def _shape(text: str) -> str:
    """A statement with comments dropped and every literal and parameter as ``?`` (pure), as
    pg_stat_statements shows it (it replaces constants with ``$n``)."""
    return " ".join(_LITERAL.sub("?", text).split())


_NAMES = {_shape(text): name for name, text in sql.QUERIES.items()}


def statement_name(query: str) -> str:
    """The queries.sql name of a statement pg_stat_statements shows, or its first 60 characters."""
    shape = _shape(query)
    if shape in _NAMES:
        return _NAMES[shape]

    def common(a: str) -> int:
        n = 0
        for x, y in zip(a, shape, strict=False):
            if x != y:
                break
            n += 1
        return n

    best = max(_NAMES, key=common)
    return _NAMES[best] if common(best) >= 100 else " ".join(query.split())[:60]


async def statements_available(conn: asyncpg.Connection) -> bool:
    preload = await conn.fetchval("SELECT current_setting('shared_preload_libraries')")
    if "pg_stat_statements" not in preload:
        return False
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


async def table_updates(conn: asyncpg.Connection) -> dict[str, dict[str, int]]:
    """Cumulative updates and HOT updates of the judgequeue tables (``pg_stat_user_tables``)."""
    await asyncio.sleep(1.2)  # backends flush their table counters at most once a second
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = await conn.fetch(
        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE schemaname = 'judgequeue' AND relname IN ('outbox', 'submissions')"
    )
    return {r["relname"]: {"upd": r["n_tup_upd"], "hot": r["n_tup_hot_upd"]} for r in rows}


def updates_per_job(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], jobs: int
) -> dict[str, dict[str, float]]:
    """Updates and HOT updates per job of each table between two :func:`table_updates` readings (pure)."""
    return {
        table: {k: (after[table][k] - before.get(table, {}).get(k, 0)) / jobs for k in ("upd", "hot")}
        for table in after
    }


async def read_statements(conn: asyncpg.Connection, jobs: int) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT query, toplevel, calls, total_exec_time, total_plan_time, rows FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " ORDER BY total_exec_time DESC"
    )
    return [
        {
            "name": ("" if r["toplevel"] else "  (in function) ") + statement_name(r["query"]),
            "toplevel": r["toplevel"],
            "calls_per_job": r["calls"] / jobs,
            "exec_us_per_job": 1000 * r["total_exec_time"] / jobs,
            "exec_us_per_call": 1000 * r["total_exec_time"] / max(1, r["calls"]),
            "plan_us_per_job": 1000 * r["total_plan_time"] / jobs,
            "rows_per_call": r["rows"] / max(1, r["calls"]),
        }
        for r in rows
        if "pg_stat_statements" not in r["query"]
    ]


# --------------------------------------------------------------------------- the three measurements


async def limits(seconds: int) -> dict[str, float]:
    dsn = await create_database("jq_limits")
    postmaster, redis_pid = _pids()
    try:
        conn = await asyncpg.connect(dsn)
        await conn.execute(outbox_bench.RAW_SETUP)
        await conn.close()
        pg0 = servers.tree_cpu_seconds(postmaster) if postmaster else 0.0
        me0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        tps = await asyncio.to_thread(pgbench, dsn, outbox_bench.RAW_SUBMIT, clients=8, seconds=seconds)
        me1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        pg1 = servers.tree_cpu_seconds(postmaster) if postmaster else 0.0
        conn = await asyncpg.connect(dsn)
        done = await conn.fetchval("SELECT count(*) FROM raw.outbox")
        await conn.close()
    finally:
        await drop_database(dsn)
    r0 = servers.cpu_seconds(redis_pid) if redis_pid else 0.0
    xadd = await asyncio.to_thread(redis_benchmark_xadd, pipeline=16, redis_url=os.environ["JUDGEQUEUE_TEST_REDIS_URL"])
    r1 = servers.cpu_seconds(redis_pid) if redis_pid else 0.0
    client = (me1.ru_utime - me0.ru_utime) + (me1.ru_stime - me0.ru_stime)
    return {
        "pgbench_two_insert_tps": tps,
        "pgbench_postgres_cpu_ms_per_tx": 1000 * (pg1 - pg0) / max(1, done),
        "pgbench_client_cpu_ms_per_tx": 1000 * client / max(1, done),
        "redis_xadd_pipelined_s": xadd,
        "redis_cpu_us_per_xadd": 1e6 * (r1 - r0) / 200_000,
    }


#: Commit to the judge's start, in ms, per job: the noop judge notes when it ran (host clock, as
#: bench.pipeline); the sleep judge only how long it slept, so its start is the verdict's time less
#: the sleep (both on the database clock; the verdict's own write is in it, a millisecond or so).
COMMIT_TO_START_MS = (
    "SELECT 1000 * coalesce("
    " (verdict->'details'->>'started_at')::float8 - extract(epoch FROM created_at)::float8,"
    " extract(epoch FROM finished_at - created_at)::float8 - (verdict->'details'->>'slept')::float8) AS ms"
    " FROM judgequeue.submissions WHERE id > $1"
)


async def _wait_all_done(pool: asyncpg.Pool, after: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        async with pool.acquire() as conn:
            left = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM judgequeue.submissions WHERE id > $1 AND finished_at IS NULL)", after
            )
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs not finished within {within}s")
        await asyncio.sleep(0.2)


def start_profilers(procs: dict[str, list[int]], seconds: float, out: Path) -> list[subprocess.Popen[bytes]]:
    """py-spy (collapsed stacks) on the first process of each role for ``seconds``, when installed.

    ``--native`` shows the C frames (uvloop, asyncpg's protocol, the system calls) where most of a
    role's CPU goes; it pauses the process for each sample, so profiled runs are for reading where
    the time goes, not for the figures."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        progress("py-spy not installed (pip install py-spy): no profiles")
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [str(spy), "record", "-p", str(pids[0]), "-d", str(int(seconds)), "-f", "raw", "-r", "200",
             "--native", "-o", str(out / f"{role}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pids in procs.items()
        if role != "reaper"
    ]  # fmt: skip


def top_frames(path: Path, n: int = 15) -> list[tuple[str, float]]:
    """The ``n`` functions with the most self samples in a py-spy raw profile, as fractions."""
    counts: dict[str, int] = {}
    total_samples = 0
    for line in path.read_text().splitlines():
        stack, _, num = line.rpartition(" ")
        if not num.isdigit():
            continue
        leaf = stack.split(";")[-1]
        counts[leaf] = counts.get(leaf, 0) + int(num)
        total_samples += int(num)
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    return [(name, c / max(1, total_samples)) for name, c in ranked]


def report_profiles(directory: Path) -> None:
    for f in sorted(directory.glob("*.txt")):
        progress(f"profile {f.name}: " + "; ".join(f"{name} {frac:.0%}" for name, frac in top_frames(f)))


async def judgequeue_cpu(
    rate: float,
    seconds: float,
    workers: int,
    *,
    ref: str | None = None,
    ref_intake: str = "stream",
    profile: Path | None = None,
    dispatchers: int = 1,
    payload: dict[str, Any] | None = None,
    warm_up_jobs: int = WARM_UP_JOBS,
    connections: ConnectionPeaks | None = None,
    stagger: bool = False,
    per_role: bool = False,
    **settings: str,
) -> dict[str, Any]:
    """One measured window (see the module's docstring); ``payload`` and ``stagger`` as
    :func:`paced_submit`'s, ``connections`` (when given) samples the client backends from the roles'
    start to the end; ``per_role``: every role and the application on its own component's
    credentials (docs/security.md) instead of the one superuser URL."""
    tree = ref_tree(ref) if ref is not None else None
    users: list[str] = []
    try:
        async with pipeline.stack(schema_from=tree, **_intake_of(tree, ref_intake, settings)) as s:
            peaks = connections or ConnectionPeaks()
            credentials = await role_credentials(s, users) if per_role else None

            def pids() -> dict[str, list[int]]:  # read at each sample: roles start after the watch does
                return {role: [p.pid for p in procs] for role, procs in s.procs.items()}

            async with peaks.watching(s.pool, pids):
                return await _measure(
                    s, rate, seconds, workers, tree=tree, ref=ref, profile=profile, dispatchers=dispatchers,
                    payload=payload or {}, warm_up_jobs=warm_up_jobs, peaks=peaks, stagger=stagger,
                    credentials=credentials,
                )  # fmt: skip
    finally:
        await drop_role_credentials(users)


#: The per-role run's login password (its users live for one window).
_PASSWORD = "jq-bench"


async def role_credentials(s: pipeline.Stack, users: list[str]) -> dict[str, dict[str, str]]:
    """Login users (Postgres) and ACL users (Redis) of each component for the stack's database and
    queue, as docs/security.md makes them; each component's ``JUDGEQUEUE_*`` overrides (the
    application's: its DSN as ``postgres_dsn``). Names go to ``users`` for :func:`drop_role_credentials`."""
    from judgequeue.core.store import dlq  # noqa: F401 - registers its script with the others
    from judgequeue.core.store.privileges import ROLES, queue_role
    from judgequeue.core.transport import redis_scripts
    from judgequeue.core.transport.acl import acl_rules

    await redis_scripts.load_scripts(s.redis)  # the migrator's job: the roles' users may not load them
    suffix = uuid.uuid4().hex[:8]
    scope = queue_role(s.queue)
    out: dict[str, dict[str, str]] = {}
    async with s.pool.acquire() as conn:
        await conn.execute(f'CREATE ROLE "{scope}" NOLOGIN')
        users.append(scope)
        for component in ("application", "dispatcher", "worker", "reaper"):
            user = f"jqb_{component}_{suffix}"
            await conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{_PASSWORD}' IN ROLE {ROLES[component].name}")
            users.append(user)
            env = {"postgres_dsn": _with_user(s.dsn, user)}
            if component != "application":
                await conn.execute(f'GRANT "{scope}" TO {user}')
                await s.redis.execute_command(  # type: ignore[no-untyped-call]
                    "ACL", "SETUSER", user, "on", f">{_PASSWORD}", *acl_rules(component, [s.queue])
                )
                env["redis_url"] = _with_user(s.env["JUDGEQUEUE_REDIS_URL"], user)
            out[component] = env
    return out


def _with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{_PASSWORD}@{parts.netloc.rsplit('@', 1)[-1]}"))


async def drop_role_credentials(users: list[str]) -> None:
    if not users:
        return
    import redis.asyncio as aioredis

    from tests.support.databases import ADMIN_DSN, REDIS_URL

    conn = await asyncpg.connect(ADMIN_DSN)
    redis = aioredis.Redis.from_url(REDIS_URL)
    try:
        for user in reversed(users):
            await conn.execute(f'DROP ROLE IF EXISTS "{user}"')
            await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
    finally:
        await conn.close()
        await redis.aclose()


def _intake_of(tree: str | None, ref_intake: str, settings: dict[str, str]) -> dict[str, str]:
    # The reference runs --ref-intake (trees older than direct intake ignore it); this tree runs
    # the run's --intake (bench.pipeline.stack reads it) unless ``settings`` name one.
    intake = ref_intake if tree is not None else os.environ.get(INTAKE_VARIABLE, DEFAULT_INTAKE)
    return {"intake": intake, **settings}


async def _measure(
    s: pipeline.Stack,
    rate: float,
    seconds: float,
    workers: int,
    *,
    tree: str | None,
    ref: str | None,
    profile: Path | None,
    dispatchers: int,
    payload: dict[str, Any],
    warm_up_jobs: int,
    peaks: ConnectionPeaks,
    stagger: bool,
    credentials: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    intake = s.env["JUDGEQUEUE_INTAKE"]
    own = credentials or {}
    label = "judgequeue"
    if tree is not None:
        # The reference's roles run on the reference's own schema (its migrations, not this tree's).
        s.env["PYTHONPATH"] = tree
        label = f"judgequeue@{ref}" + (f"/{intake}" if intake != "stream" else "")
    elif intake != DEFAULT_INTAKE:
        label = f"judgequeue/{intake}"
    if credentials is not None:
        label += "/per-role"
    s.start("dispatcher", dispatchers, **own.get("dispatcher", {}))
    s.start("worker", workers, **own.get("worker", {}))
    s.start("reaper", 1, **own.get("reaper", {}))
    after = await pipeline.warm_up(s, warm_up_jobs)
    async with s.pool.acquire() as conn:
        # Statistics of tables that hold a few thousand rows, as a queue in service does: the
        # roles' cached plans are invalidated and rebuilt from them. Without this the plans
        # built while the fresh tables were empty (sequential scans) served the whole window,
        # growing with the table: 0.2-0.5 sequential scans per job, a few hundred µs each.
        await conn.execute("ANALYZE judgequeue.outbox, judgequeue.submissions")
    await asyncio.sleep(1.0)  # let the roles settle after warm-up before the window opens
    async with s.pool.acquire() as conn:
        have_statements = await statements_available(conn)
        if have_statements:
            await conn.execute("SELECT pg_stat_statements_reset()")
        updates_before = await table_updates(conn)
    meter = Meter({role: [p.pid for p in procs] for role, procs in s.procs.items()})
    spies = start_profilers(meter.procs, seconds, profile) if profile is not None else []
    meter.begin()
    t0 = time.monotonic()
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(1) as ex:
        app = await loop.run_in_executor(
            ex, paced_submit, "judgequeue", own.get("application", {}).get("postgres_dsn", s.dsn), s.queue, rate,
            seconds, CONNECTIONS, payload, stagger,
        )
    await _wait_all_done(s.pool, after, 120)
    wall = time.monotonic() - t0
    cpu = meter.end()
    for spy in spies:
        spy.wait()
    if profile is not None:
        report_profiles(profile)
    jobs = int(app["jobs"])
    async with s.pool.acquire() as conn:
        stmts = await read_statements(conn, jobs) if have_statements else []
        updates = updates_per_job(updates_before, await table_updates(conn), jobs)
        span = await conn.fetchval(
            "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8"
            " FROM judgequeue.submissions WHERE id > $1",
            after,
        )
        lat = await conn.fetch(
            "SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 AS ms"
            " FROM judgequeue.submissions WHERE id > $1",
            after,
        )
        starts = [r["ms"] for r in await conn.fetch(COMMIT_TO_START_MS, after) if r["ms"] is not None]
    per_job = {k: 1000 * v / jobs for k, v in cpu.items()}
    per_job["application"] = 1000 * app["cpu_s"] / jobs
    samples = [r["ms"] for r in lat]
    return {
        "system": label,
        "offered_per_s": rate,
        "achieved_per_s": jobs / span,
        "jobs": jobs,
        "workers": workers,
        "dispatchers": dispatchers,
        "wall_s": wall,
        "cpu_ms_per_job": per_job,
        "statements": stmts,
        "updates_per_job": updates,
        "statements_note": "" if have_statements else "pg_stat_statements not preloaded on this server",
        "commit_to_verdict_p50_ms": pipeline.percentile(samples, 0.5),
        "commit_to_verdict_p99_ms": pipeline.percentile(samples, 0.99),
        "commit_to_start_p50_ms": pipeline.percentile(starts, 0.5),
        "commit_to_start_p99_ms": pipeline.percentile(starts, 0.99),
        "peak_connections": {"total": peaks.total, **peaks.by_role, "max_connections": peaks.max_connections},
    }


async def peer_cpu(rate: float, seconds: float, workers: int) -> dict[str, Any]:
    from bench import peer

    async with peer._Peer(workers) as p:
        meter = Meter({"worker": [proc.pid for proc in p.procs]})
        meter.begin()
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(1) as ex:
            app = await loop.run_in_executor(ex, paced_submit, "pgqueuer", p.dsn, "", rate, seconds, CONNECTIONS)
        jobs = int(app["jobs"])
        records = await p.wait_started(app["ids"], 120)
        cpu = meter.end()
    per_job = {k: 1000 * v / jobs for k, v in cpu.items()}
    per_job["application"] = 1000 * app["cpu_s"] / jobs
    span = max(r.started for r in records) - min(r.created for r in records)
    return {
        "system": "pgqueuer",
        "offered_per_s": rate,
        "achieved_per_s": jobs / span,
        "jobs": jobs,
        "workers": workers,
        "cpu_ms_per_job": per_job,
    }


# --------------------------------------------------------------------------- report


def total(per_job: dict[str, float], *, with_app: bool = False) -> float:
    """The queue side's CPU per job (``pg:*`` parts are already in ``postgres``)."""
    return sum(v for k, v in per_job.items() if not k.startswith("pg:") and (with_app or k != "application"))


def _part_order(part: str) -> tuple[int, str]:
    """Postgres's parts in the table: the roles' backends first, then the rest by name."""
    order = ["pg:dispatcher", "pg:worker", "pg:reaper", "pg:other"]
    return (order.index(part), "") if part in order else (len(order), part)


def table(r: dict[str, Any]) -> str:
    lim = r["limits"]
    lines = [
        f"machine limits (same run): pgbench two-insert {lim['pgbench_two_insert_tps']:,.0f} tx/s "
        f"(Postgres {lim['pgbench_postgres_cpu_ms_per_tx']:.3f} ms CPU/tx, pgbench client "
        f"{lim['pgbench_client_cpu_ms_per_tx']:.3f} ms/tx); redis-benchmark XADD -P16 "
        f"{lim['redis_xadd_pipelined_s']:,.0f}/s (Redis {lim['redis_cpu_us_per_xadd']:.2f} µs CPU/XADD)",
        "",
    ]
    systems = [r["judgequeue"]] + ([r["ref"]] if r.get("ref") else []) + ([r["peer"]] if r.get("peer") else [])
    roles = ["dispatcher", "worker", "reaper", "postgres", "redis", "application"]
    head = f"{'CPU ms per judged job':<28}" + "".join(f"{s['system']:>14}" for s in systems)
    lines.append(head)
    parts = sorted({k for s in systems for k in s["cpu_ms_per_job"] if k.startswith("pg:")}, key=_part_order)
    for role in roles[:4] + [f"  {p}" for p in parts] + roles[4:]:
        key = role.strip()
        cells = "".join(
            f"{s['cpu_ms_per_job'][key]:>14.3f}" if key in s["cpu_ms_per_job"] else f"{'-':>14}" for s in systems
        )
        lines.append(f"{role:<28}{cells}")
    lines.append(f"{'total (queue side)':<28}" + "".join(f"{total(s['cpu_ms_per_job']):>14.3f}" for s in systems))
    lines.append(
        f"{'total with application':<28}"
        + "".join(f"{total(s['cpu_ms_per_job'], with_app=True):>14.3f}" for s in systems)
    )
    lines.append(
        f"{'offered / achieved jobs/s':<28}"
        + "".join(f"{s['offered_per_s']:>7.0f}/{s['achieved_per_s']:<6.0f}" for s in systems)
    )
    if r.get("pair_ratios"):
        ratios = r["pair_ratios"]
        lines.append(
            f"this tree / ref, round by round: {', '.join(f'{x:.2f}' for x in ratios)}"
            f" (median {statistics.median(ratios):.2f})"
        )
    for jq in systems[: 2 if r.get("ref") else 1]:
        lines.append(
            f"{jq['system']} row updates per job: "
            + ", ".join(
                f"{table} {u['upd']:.2f} ({u['hot']:.2f} HOT)"
                for table, u in sorted(jq.get("updates_per_job", {}).items())
            )
        )
        lines.append(
            f"{jq['system']} commit->verdict p50 {jq['commit_to_verdict_p50_ms']:.1f} ms,"
            f" p99 {jq['commit_to_verdict_p99_ms']:.1f} ms"
        )
    lines.append("")
    for jq in systems[: 2 if r.get("ref") else 1]:
        lines += [*statement_table(jq), ""]
    return "\n".join(lines)


def pair_ratios(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[float]:
    """This tree's queue-side total over the reference's, round by round (pure).

    The machine's speed drifts by 20-30% within minutes (the unchanged application's CPU per job
    moves with it), so the best of each side may come from different moments; the two runs of one
    round are adjacent, and their ratio is the comparison that drift disturbs least.
    """
    return [total(a["cpu_ms_per_job"]) / total(b["cpu_ms_per_job"]) for a, b in zip(mine, theirs, strict=True)]


def statement_table(jq: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if jq["statements"]:
        title = f"top statements ({jq['system']})"
        lines.append(f"{title:<44}{'calls/job':>10}{'µs/job':>10}{'µs/call':>10}{'rows/call':>10}{'plan µs/job':>12}")
        for st in jq["statements"][:12]:
            lines.append(
                f"{st['name'][:44]:<44}{st['calls_per_job']:>10.3f}{st['exec_us_per_job']:>10.1f}"
                f"{st['exec_us_per_call']:>10.1f}{st['rows_per_call']:>10.1f}{st.get('plan_us_per_job', 0.0):>12.1f}"
            )
        top = [st for st in jq["statements"] if st["toplevel"]]
        calls = sum(st["calls_per_job"] for st in top)
        exec_us = sum(st["exec_us_per_job"] for st in top)
        plan_us = sum(st.get("plan_us_per_job", 0.0) for st in top)
        lines.append(f"{'all top-level statements':<44}{calls:>10.3f}{exec_us:>10.1f}{'':>20}{plan_us:>12.1f}")
    else:
        lines.append(f"(no per-statement figures: {jq['statements_note']})")
    return lines


async def inner(args: argparse.Namespace) -> dict[str, Any]:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": load}
    progress("limits: pgbench two-insert, redis-benchmark XADD")
    results["limits"] = await limits(args.limit_seconds)
    if args.ref:
        # Reference and current code alternate, best (lowest total) of ``--rounds`` each.
        mine, theirs = [], []
        for k in range(args.rounds):
            progress(f"judgequeue@{args.ref} at {args.rate:g} jobs/s for {args.seconds:g}s, round {k + 1}")
            theirs.append(
                await judgequeue_cpu(args.rate, args.seconds, args.workers, ref=args.ref, ref_intake=args.ref_intake)
            )
            progress(f"judgequeue (this tree) at {args.rate:g} jobs/s for {args.seconds:g}s, round {k + 1}")
            mine.append(await judgequeue_cpu(args.rate, args.seconds, args.workers))
        results["judgequeue"] = min(mine, key=lambda x: total(x["cpu_ms_per_job"]))
        results["ref"] = min(theirs, key=lambda x: total(x["cpu_ms_per_job"]))
        results["rounds"] = {"judgequeue": mine, "ref": theirs}
        results["pair_ratios"] = pair_ratios(mine, theirs)
    elif args.per_role:
        # One superuser URL and per-role credentials alternate, best (lowest total) of ``--rounds`` each.
        mine, theirs = [], []
        for k in range(args.rounds):
            progress(f"judgequeue, one superuser URL, at {args.rate:g} jobs/s for {args.seconds:g}s, round {k + 1}")
            theirs.append(await judgequeue_cpu(args.rate, args.seconds, args.workers))
            progress(f"judgequeue, per-role credentials, at {args.rate:g} jobs/s for {args.seconds:g}s, round {k + 1}")
            mine.append(await judgequeue_cpu(args.rate, args.seconds, args.workers, per_role=True))
        results["judgequeue"] = min(mine, key=lambda x: total(x["cpu_ms_per_job"]))
        results["ref"] = min(theirs, key=lambda x: total(x["cpu_ms_per_job"]))
        results["rounds"] = {"judgequeue": mine, "ref": theirs}
        results["pair_ratios"] = pair_ratios(mine, theirs)
    else:
        progress(f"judgequeue at {args.rate:g} jobs/s for {args.seconds:g}s, {args.workers} worker(s)")
        results["judgequeue"] = await judgequeue_cpu(args.rate, args.seconds, args.workers, profile=args.profile)
    if not args.skip_peer:
        progress(f"PgQueuer at {args.rate:g} jobs/s for {args.seconds:g}s, {args.workers} worker(s)")
        results["peer"] = await peer_cpu(args.rate, args.seconds, args.workers)
    results["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return results


def parser() -> argparse.ArgumentParser:
    p = new_parser(__doc__)
    p.add_argument("--rate", type=float, default=1000.0, help="offered jobs/s")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the offered load")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--limit-seconds", type=int, default=8, help="pgbench run length")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--profile", type=Path, help="py-spy the dispatcher and a worker into this directory")
    p.add_argument("--ref", help="also measure this git revision's roles (e.g. main), alternating with this tree")
    p.add_argument(
        "--ref-intake", choices=("stream", "direct"), default="stream", help="JUDGEQUEUE_INTAKE of the --ref roles"
    )
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds with --ref or --per-role (best of each)")
    p.add_argument(
        "--per-role", action="store_true",
        help="measure every role on its own component's credentials against the one superuser URL, alternating",
    )  # fmt: skip
    return add_run_options(p)


async def measure_and_print(args: argparse.Namespace) -> int:
    """The ``--inner`` run: measure, write ``cpu.json``, print the table."""
    results = await inner(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    print(f"\nload average {results['loadavg_start']} -> {results['loadavg_end']}; results: {args.out / 'cpu.json'}")
    return 0


def main() -> int:
    return run_on_servers("bench.cpu", parser(), measure_and_print)


if __name__ == "__main__":
    sys.exit(main())
