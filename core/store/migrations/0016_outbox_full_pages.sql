-- judgequeue 0016: outbox pages full again (the default fillfactor); submissions keep 0015's room.
-- The free third of the outbox's pages bought nothing measurable at saturation (bench.e2e, 1
-- worker, alternating: 70-72% of pgbench with full pages against 67-71%): most rows are written
-- already sent by a filled offer, or leave the claim index on their one update anyway. It cost
-- every submit a page extension a third more often: submit() in a queue nobody offers in cost
-- 1.02x the previous release's with it, 1.01x without (bench.outbox_bench --ref, medians of five
-- alternating rounds). As in 0015, only pages written from now on follow it.
ALTER TABLE judgequeue.outbox RESET (fillfactor);
