-- judgequeue 0004: find submissions whose delivery was sent but never leased.
-- If Redis loses its data (restart without persistence, failover to an empty replica, a flush),
-- SENT outbox rows point at stream entries that no longer exist. The reaper re-sends the current
-- generation's row of submissions still PENDING long after it was sent; the dispatcher's dedup
-- marker absorbs the re-send when the entry (and its marker) did survive. Only PENDING rows are
-- indexed, so the scan costs what is waiting, not what is finished.
CREATE INDEX submissions_pending ON judgequeue.submissions (queue, created_at) WHERE status = 'PENDING';
