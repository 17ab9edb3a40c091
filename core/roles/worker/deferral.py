"""Jobs a judge gives back to be tried again later, without holding a worker slot meanwhile.

A judge raises :class:`~judgequeue.core.judges.CallLater` (the http-call judge does, for a 429, a
503, a timeout, or an endpoint at its concurrency bound). The worker hands the job's lease here:
:func:`leases.defer` moves it, fenced like a verdict, to a new generation of the same request whose
outbox row waits until the not-before time, so the slot frees at once and the job
comes back through the dispatcher (or direct intake) when it is due.
"""

from __future__ import annotations

import logging

import asyncpg

from ...base import metrics
from ...base.errors import reason
from ...judges import CallLater, Verdict
from ...runtime.lifecycle import DB_ERRORS
from ...store import leases
from ...transport.connect import STATEMENT_TIMEOUT

log = logging.getLogger("judgequeue.worker")


async def defer(
    pool: asyncpg.Pool, queue: str, lease: leases.Lease, later: CallLater, *, shadow: bool = False
) -> Verdict | None:
    """Give ``lease`` back to be tried again after ``later.delay``; None once that is settled (the
    worker writes no verdict), or the verdict to write instead where the job cannot wait: a shadow
    lease (shadow verdicts are judged once, never deferred).

    A lease lost meanwhile changes nothing (counted as a stale result); a database that does not
    answer leaves the lease to expire and be rescued by the reaper, like a crash: never lost.
    """
    if shadow:
        return Verdict("SYSTEM_ERROR", {"reason": f"a shadow job is not tried again later: {later.reason}"[:2000]})
    try:
        async with pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            moved = await leases.defer(conn, lease, delay=later.delay, failed=later.failed, reason=later.reason)
    except DB_ERRORS as exc:
        log.warning("deferral failed; the lease expiry will rescue the job",
                    extra={"submission": lease.submission, "error": reason(exc)})  # fmt: skip
        return None
    if moved is None:
        metrics.STALE_RESULTS_DROPPED.labels(queue, "stale_deferral").inc()
        log.info("deferral of a lost lease dropped", extra={"submission": lease.submission})
        return None
    metrics.JOBS_DEFERRED.labels(queue, "failed" if later.failed else "waited").inc()
    log.info("job deferred", extra={"submission": lease.submission, "delay": later.delay, "reason": later.reason})
    return None
