-- judgequeue 0015: leave a third of each new page of submissions and outbox free. Their rows are
-- updated once or twice within moments of their insert (leased, sent, given a verdict); with full
-- pages each new version went to another page, most often the one the submits were filling at
-- that moment. End to end at saturation (bench.e2e, 1 worker) went from 62-66% of pgbench's
-- two-insert transaction to 68-70%, at the same CPU per job. Only pages written from now on
-- follow it; no table is rewritten, and the lock taken lets reads and writes go on.
ALTER TABLE judgequeue.submissions SET (fillfactor = 70);
ALTER TABLE judgequeue.outbox SET (fillfactor = 70);
