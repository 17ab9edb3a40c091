-- judgequeue 0005: narrow the stranded-delivery index so the lease query can never pick it.
-- 0004's predicate (status = 'PENDING') is implied by the worker's lease acquire, and with a backlog
-- the planner scanned every pending row of the queue instead of looking each id up (hundreds of
-- milliseconds per batch). "attempt_id IS NULL" (never leased in this generation) is what the
-- stranded scan means anyway, and the lease query does not imply it.
DROP INDEX judgequeue.submissions_pending;
CREATE INDEX submissions_never_leased ON judgequeue.submissions (queue, created_at)
    WHERE status = 'PENDING' AND attempt_id IS NULL;
