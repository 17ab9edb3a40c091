-- Live per-test progress (opt-in per queue, the worker's JUDGEQUEUE_PROGRESS): a judging attempt's
-- progress (compiled, tests done of total, the last test's verdict and time) is an event row of its
-- own kind beside the verdicts, in the same log, so readers get both in one order. A worker writes
-- at most one progress row per job per interval (coalesced), fenced like its verdict on (id,
-- generation, attempt, JUDGING). Pruned with the verdicts (same table, same retention).
ALTER TABLE judgequeue.verdict_events
    ADD COLUMN kind text NOT NULL DEFAULT 'verdict' CHECK (kind IN ('verdict', 'progress')),
    ADD COLUMN progress jsonb;
