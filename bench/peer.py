"""The same end-to-end workload on a peer queue: PgQueuer (PyPI ``pgqueuer``), for the side-by-side table.

Mirrors ``bench/pipeline.py`` on a throwaway database (``bench.common.create_database``, PgQueuer's
schema installed next to judgequeue's, dropped afterwards). Workers are real OS processes, each one
PgQueuer ``QueueManager`` with a noop entrypoint that records when it was called. Before each
measurement 50 warm-up jobs go through every worker (processes started, connections open, LISTEN
registered), as bench/pipeline.py does; they are not counted.

1. ``peer_throughput(jobs, submitters, workers)``: ``jobs`` enqueued one per transaction (one
   ``Queries.enqueue`` call = one autocommit INSERT) by ``submitters`` concurrent connections while the
   workers run; rate = jobs / (first enqueue -> last job started).
2. ``peer_latency(rate, seconds, workers)``: a steady ``rate`` jobs/s offered for ``seconds`` over one
   connection; per-job enqueue -> start latency, p50/p99/max in ms.

Clocks. The enqueue time is the job's ``created`` column (``DEFAULT now()``, the enqueue transaction's
start, on the DB clock), handed to the entrypoint in ``Job.created``: the same definition as
judgequeue's ``submissions.created_at``. The start time is ``time.time()`` taken first thing in the
entrypoint, in the worker process. Postgres runs on this host, so ``now()`` and ``time.time()`` read the
same system clock (CLOCK_REALTIME); asking the DB for ``clock_timestamp()`` instead would add a round
trip to every job. judgequeue's figure ends later than this one: at ``finished_at``, the commit of the
fenced verdict after the judge ran, where PgQueuer's ends when the job starts. The comparison is
therefore tilted in PgQueuer's favour, not against it.

PgQueuer configuration (version printed with the figures), from its own documentation and tools:

- driver: ``AsyncpgDriver`` over one asyncpg connection per worker process, the default of PgQueuer's
  own ``tools/benchmark.py`` (``--driver apg``); judgequeue also uses asyncpg;
- event loop: uvloop, which PgQueuer installs as a dependency and which ``pgq run`` uses when present
  (judgequeue's roles run on the stdlib asyncio loop);
- ``batch_size=10`` (jobs claimed per dequeue round trip): the default of ``QueueManager.run``,
  ``pgq run`` and PgQueuer's own benchmark. A sweep on this machine (5,000 jobs, 8 submitters, 1 and 2
  workers, batch 10/50/100, twice each) found no consistent winner: every run finished within a few
  percent of the submitters' own enqueue rate (``enqueue_per_s``), i.e. the claim keeps up and the
  figure is bounded by the one-per-transaction enqueues, so the documented default stays (change it
  with ``--batch-size`` / ``batch_size=``);
- ``max_concurrent_tasks=None`` (no per-worker cap; PgQueuer's default, and the cheapest dequeue query,
  without the worker-budget CTEs) and no per-entrypoint ``concurrency_limit`` (0 = unlimited): a noop
  job never holds a slot long, so a cap would only slow the claim;
- ``dequeue_timeout`` 30 s and ``heartbeat_timeout`` 30 s (defaults): workers are woken by the NOTIFY
  trigger on insert, the timeout is only the polling fallback;
- durability left at the default (``durable``: logged tables), like judgequeue's tables; the volatile
  (unlogged) mode would trade crash safety for speed and is not comparable.

    .venv/bin/python -m bench.peer --jobs 5000 --rate 200 --seconds 10 --workers 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import create_database, drop_database
from judgequeue.core.runtime.process import event_loop_factory

ENTRYPOINT = "noop"
DEFAULT_BATCH_SIZE = 10
WARM_UP_JOBS = 50
REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER_MAIN = "from bench.peer import worker_main; worker_main()"


# --------------------------------------------------------------------------- worker process side


def worker_main() -> None:
    """Entry of one worker process: ``PEER_DSN``, ``PEER_OUT`` (record file), ``PEER_BATCH_SIZE``."""
    import uvloop

    uvloop.run(_worker(os.environ["PEER_DSN"], Path(os.environ["PEER_OUT"]), int(os.environ["PEER_BATCH_SIZE"])))


async def _worker(dsn: str, out: Path, batch_size: int) -> None:
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

    started: list[str] = []

    conn = await asyncpg.connect(dsn)
    qm: Any = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)  # type: ignore[untyped-decorator]
    async def noop(job: Job) -> None:
        now = time.time()
        started.append(f"{job.id} {job.created.timestamp():.6f} {now:.6f}\n")

    async def flusher() -> None:
        with out.open("a", buffering=1 << 16) as f:
            while True:
                await asyncio.sleep(0.01)
                if started:
                    batch = started[:]
                    del started[: len(batch)]
                    f.write("".join(batch))
                    f.flush()

    flush_task = asyncio.create_task(flusher())
    try:
        await qm.run(batch_size=batch_size)
    finally:
        flush_task.cancel()


# --------------------------------------------------------------------------- harness side


@dataclass
class _Record:
    created: float  # enqueue transaction start, DB clock (epoch seconds)
    started: float  # entrypoint call, time.time() in the worker (epoch seconds)


@dataclass
class _Peer:
    """A throwaway database with PgQueuer installed and ``workers`` worker processes."""

    workers: int
    batch_size: int = DEFAULT_BATCH_SIZE
    dsn: str = ""
    tmp: tempfile.TemporaryDirectory[str] | None = None
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    records: dict[int, _Record] = field(default_factory=dict)
    _offsets: dict[Path, int] = field(default_factory=dict)

    async def __aenter__(self) -> _Peer:
        from pgqueuer import AsyncpgDriver, Queries

        self.dsn = await create_database("jq_peer")
        try:
            conn = await asyncpg.connect(self.dsn)
            try:
                await Queries(AsyncpgDriver(conn)).install()
            finally:
                await conn.close()
            self.tmp = tempfile.TemporaryDirectory(prefix="jq_peer_")
            for i in range(self.workers):
                out = Path(self.tmp.name) / f"worker{i}.log"
                out.touch()
                self._offsets[out] = 0
                env = {
                    **os.environ,
                    "PEER_DSN": self.dsn,
                    "PEER_OUT": str(out),
                    "PEER_BATCH_SIZE": str(self.batch_size),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
                }
                stderr = (Path(self.tmp.name) / f"worker{i}.err").open("w")
                try:
                    proc = await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-c",
                        WORKER_MAIN,
                        env=env,
                        cwd=REPO_ROOT,
                        stdout=asyncio.subprocess.DEVNULL,
                        stderr=stderr,
                    )
                finally:
                    stderr.close()
                self.procs.append(proc)
            await self.wait_started(await self.enqueue(WARM_UP_JOBS, 1), 60)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.kill()
            await p.wait()
        if self.dsn:
            await drop_database(self.dsn)
        if self.tmp is not None:
            self.tmp.cleanup()

    async def enqueue(self, n: int, connections: int, processes: int = 2) -> list[int]:
        """Enqueue ``n`` jobs, one per transaction, over ``connections`` connections in all, from
        ``processes`` application processes on uvloop: the same submit side as judgequeue's
        (``bench.pipeline.submit_many``)."""
        if n < 200 or processes <= 1:
            return await _enqueue_lanes(self.dsn, n, connections)
        loop = asyncio.get_running_loop()
        share = [n // processes + (1 if i < n % processes else 0) for i in range(processes)]
        with ProcessPoolExecutor(processes) as pool:
            parts = await asyncio.gather(
                *(
                    loop.run_in_executor(pool, _enqueue_process, self.dsn, k, max(1, connections // processes))
                    for k in share
                )
            )
        return [i for ids in parts for i in ids]

    def _collect(self) -> None:
        for path, offset in self._offsets.items():
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            for line in data[:end].splitlines():
                job_id, created, started = line.split()
                self.records[int(job_id)] = _Record(float(created), float(started))
            self._offsets[path] = offset + end

    async def wait_started(self, ids: Iterable[int], within: float) -> list[_Record]:
        """Wait until every job of ``ids`` has started; returns their records."""
        wanted = set(ids)
        deadline = time.monotonic() + within
        while True:
            self._collect()
            if wanted.issubset(self.records):
                return [self.records[i] for i in wanted]
            dead = [p.returncode for p in self.procs if p.returncode is not None]
            if dead or time.monotonic() > deadline:
                missing = len(wanted - self.records.keys())
                err = ""
                if self.tmp is not None:
                    err = (Path(self.tmp.name) / "worker0.err").read_text()[-2000:]
                why = f"workers exited {dead}" if dead else f"not within {within}s"
                raise RuntimeError(f"{missing} of {len(wanted)} PgQueuer jobs never started ({why})\n{err}")
            await asyncio.sleep(0.02)


async def _enqueue_lanes(dsn: str, n: int, connections: int) -> list[int]:
    from pgqueuer import AsyncpgDriver, Queries

    async def submitter(count: int) -> list[int]:
        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            ids: list[int] = []
            for _ in range(count):
                ids += await queries.enqueue(ENTRYPOINT, None)
            return ids
        finally:
            await conn.close()

    share = [n // connections + (1 if i < n % connections else 0) for i in range(connections)]
    return [i for ids in await asyncio.gather(*(submitter(c) for c in share)) for i in ids]


def _enqueue_process(dsn: str, n: int, connections: int) -> list[int]:
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(_enqueue_lanes(dsn, n, connections))


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as Postgres's percentile_cont."""
    if len(values) == 1:
        return values[0]
    if q == 0.5:
        return statistics.median(values)
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _context() -> dict[str, Any]:
    return {
        "system": "pgqueuer",
        "version": version("pgqueuer"),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


async def peer_throughput(
    jobs: int, submitters: int, workers: int, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> dict[str, Any]:
    """``jobs`` enqueued one per transaction by ``submitters`` connections; rate to the last job started.

    Returns ``{"system", "version", "jobs", "submitters", "workers", "batch_size", "seconds",
    "jobs_per_s", "enqueue_per_s", "cpus", "loadavg"}`` (seconds = first enqueue -> last start; enqueue_per_s
    = the submitters' own rate, workers running; loadavg taken at the end).
    """
    async with _Peer(workers, batch_size) as peer:
        t0 = time.monotonic()
        ids = await peer.enqueue(jobs, submitters)
        enqueue_seconds = time.monotonic() - t0
        records = await peer.wait_started(ids, 300)
    span = max(r.started for r in records) - min(r.created for r in records)
    return {
        **_context(),
        "jobs": jobs,
        "submitters": submitters,
        "workers": workers,
        "batch_size": batch_size,
        "seconds": span,
        "jobs_per_s": jobs / span,
        "enqueue_per_s": jobs / enqueue_seconds,
    }


async def peer_latency(
    rate: float, seconds: float, workers: int, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> dict[str, Any]:
    """A steady ``rate`` jobs/s for ``seconds`` over one connection; enqueue -> start latency.

    Returns ``{"system", "version", "workers", "batch_size", "offered_per_s", "achieved_per_s", "jobs",
    "p50_ms", "p99_ms", "max_ms", "samples_ms", "clock", "cpus", "loadavg"}``.
    """
    from pgqueuer import AsyncpgDriver, Queries

    total = int(rate * seconds)
    interval = 1.0 / rate
    async with _Peer(workers, batch_size) as peer:
        conn = await asyncpg.connect(peer.dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            ids: list[int] = []
            start = time.monotonic()
            for i in range(total):
                delay = start + i * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                ids += await queries.enqueue(ENTRYPOINT, None)
            achieved = total / (time.monotonic() - start)
        finally:
            await conn.close()
        records = await peer.wait_started(ids, 60)
    latencies = sorted(r.started - r.created for r in records)
    return {
        **_context(),
        "workers": workers,
        "batch_size": batch_size,
        "offered_per_s": rate,
        "achieved_per_s": achieved,
        "jobs": total,
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "max_ms": latencies[-1] * 1000,
        "samples_ms": [x * 1000 for x in latencies],
        "clock": "created (DB now(), enqueue txn start) -> time.time() at entrypoint call; same host clock",
    }


async def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="worker process counts to measure")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--submitters", type=int, default=8, help="concurrent enqueueing connections")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--latency-workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="PgQueuer dequeue batch size")
    args = parser.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"PgQueuer {version('pgqueuer')}, cpus={os.cpu_count()}, load average {load}; noop entrypoint", flush=True)
    for n in (int(x) for x in args.workers.split(",") if x):
        r = await peer_throughput(args.jobs, args.submitters, n, batch_size=args.batch_size)
        print(
            f"throughput: workers={n} batch_size={r['batch_size']}: {r['jobs']} jobs (enqueued one per transaction "
            f"by {r['submitters']} connections) in {r['seconds']:.2f}s = {r['jobs_per_s']:,.0f} jobs/s "
            f"(enqueue alone {r['enqueue_per_s']:,.0f}/s; load {' '.join(map(str, r['loadavg']))})",
            flush=True,
        )
    r = await peer_latency(args.rate, args.seconds, args.latency_workers, batch_size=args.batch_size)
    print(
        f"latency: workers={r['workers']} offered {r['offered_per_s']:g}/s for {args.seconds:g}s "
        f"({r['achieved_per_s']:.0f}/s achieved): enqueue->start p50={r['p50_ms']:.1f}ms "
        f"p99={r['p99_ms']:.1f}ms max={r['max_ms']:.1f}ms (load {' '.join(map(str, r['loadavg']))})",
        flush=True,
    )


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
