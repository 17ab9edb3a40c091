-- judgequeue 0029: fair_seq() and submit() probe their indexes whatever the statistics say.
--
-- Their outbox lookups (a key's last waiting turn, the class's head, whether a waiting job of the
-- class is ahead of a first-class submit) are written as index probes along outbox_fair_key and
-- outbox_claim, but on an outbox analysed while it was small the planner chose sequential scans:
-- each keyed submit then read every waiting row of its class, so a contest's start submitted in one
-- statement (or many keyed submits before the next analyse) took time quadratic in its size (10,000
-- keyed submits in one statement: 33 s instead of under 1 s, with the offers that transaction
-- filled locked as long), and each first-class submit beside another contest's backlog read that
-- whole backlog. With sequential scans disabled inside the two functions every lookup is an index
-- probe. Behaviour is unchanged.
ALTER FUNCTION judgequeue.fair_seq(text, smallint, text) SET enable_seqscan = off;
ALTER FUNCTION judgequeue.submit(text, jsonb, text, text) SET enable_seqscan = off;
