-- judgequeue 0009: terminal submissions are pruned after the reaper's retention (docs/design.md §9,
-- invariant 5: nothing grows without bound under steady load).
--
-- The reaper deletes a queue's terminal submissions whose finished_at is older than the retention,
-- oldest first, in small batches. This partial index serves that scan: only finished rows enter it
-- (every terminal status sets finished_at; a generation bump clears it), so it holds what the
-- retention keeps and the scan starts at the oldest without reading anything still waiting.
CREATE INDEX submissions_finished ON judgequeue.submissions (queue, finished_at)
    WHERE finished_at IS NOT NULL;
