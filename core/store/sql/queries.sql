-- Every SQL statement judgequeue runs, outside the schema (schema.sql), the migrations and the
-- migration runner's own bookkeeping (docs/design.md §2). Each sits under `-- name: <name>` with a
-- one-line comment and is run through judgequeue.core.sql.query(name). Statements are fixed text:
-- values are parameters, and state lists come from judgequeue.core.states as array parameters
-- (except where a literal list must match a partial index predicate; tests/integration/test_sql.py
-- checks those against states too). Text several statements share is written once, under
-- `-- fragment: <name>` with a one-line comment, and pasted in when the file is read where a statement
-- says `-- include: <name>`, its {{placeholders}} filled with text written here (syntax: the
-- docstring of core/store/sql/__init__.py): what runs is the statement written out in full.

-- name: submit
-- Write a submission and its outbox row in the caller's transaction, in the queue's first class; returns the id.
SELECT judgequeue.submit($1, $2::jsonb)

-- name: submit_in_class
-- Write a submission and its outbox row in the caller's transaction, in class $3 with fairness key $4; returns the id.
SELECT judgequeue.submit($1, $2::jsonb, $3, $4)

-- name: rejudge
-- Start a new generation of a submission and queue it in class $2 (NULL: the lowest); returns the generation.
SELECT judgequeue.rejudge($1, $2)

-- name: rejudge_many
-- A bulk rejudge in one statement: a queue's submissions by ids, problem and creation time, in class $2.
SELECT submission_id, generation
  FROM judgequeue.rejudge_many($1, $2, $3::bigint[], $4, $5::timestamptz, $6::timestamptz)

-- fragment: claim_walk
-- A claim's walk of the outbox (outbox_mark_claim, lease_direct): claim_plan's classes along outbox_claim, locked.
    SELECT p.id
      FROM judgequeue.claim_plan(coalesce((SELECT shares FROM q), '{}'::smallint[]), {{rows}}) AS r
     CROSS JOIN LATERAL (
        SELECT o.id
          FROM judgequeue.outbox o
         WHERE o.queue = {{queue}} AND o.class_rank = r.rank
           AND o.state IN ('PENDING', 'CLAIMED')
{{ready}}
         ORDER BY o.fair_seq, o.next_attempt_at, o.id
         LIMIT r.quota OFFSET r.skip
           FOR UPDATE SKIP LOCKED
     ) p
     LIMIT {{rows}}

-- name: outbox_mark_claim
-- Mark a dispatched batch's outcomes (fenced on the claim owner; DEAD ends the submission) and claim
-- ready rows with the queue's flags, in one statement and commit; either part may be empty (no
-- marks, or limit 0). Hot path: keep text and plan.
WITH no_flush_wait AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
), marked AS (
    UPDATE judgequeue.outbox o
       SET state = CASE
                       WHEN r.result = 'sent' THEN 'SENT'
                       WHEN r.result = 'shadow_sent' THEN 'SHADOW_SENT'
                       WHEN r.result = 'dead' THEN 'DEAD'
                       WHEN r.result = 'retry' AND o.attempts >= $4 THEN 'DEAD'
                       ELSE 'PENDING'
                   END,
           attempts = CASE WHEN r.result = 'release' THEN greatest(o.attempts - 1, 0) ELSE o.attempts END,
           last_error = coalesce(r.error, o.last_error),
           next_attempt_at = CASE
               WHEN r.result = 'retry' THEN now() + make_interval(
                   secs => least($6::float8, $5::float8 * power(2, greatest(o.attempts - 1, 0)))
                           * (0.5 + random() * 0.5))
               WHEN r.result = 'release' THEN now() + make_interval(secs => $5::float8 * (0.5 + random() * 0.5))
               ELSE o.next_attempt_at END,
           claim_expires_at = NULL,
           sent_at = CASE
               WHEN r.result = 'release' OR (r.result = 'retry' AND o.attempts < $4) THEN NULL
               ELSE now() END
      FROM unnest($1::bigint[], $2::text[], $3::text[]) AS r(id, result, error), no_flush_wait
     WHERE o.id = ANY($1::bigint[])  -- by key whatever the plan guesses of the arrays (see lease_direct)
       AND o.id = r.id AND o.claimed_by = $7 AND o.state = 'CLAIMED'
    RETURNING o.id, o.state, o.submission_id, o.generation, o.last_error, o.attempts
), failed AS (
    -- A delivery intent that will never be sent must not leave its submission waiting forever.
    UPDATE judgequeue.submissions s
       SET status = 'SYSTEM_ERROR',
           verdict = jsonb_build_object(
               'status', 'SYSTEM_ERROR',
               'reason', format('dispatch failed after %s attempts: %s', m.attempts, m.last_error)),
           finished_at = now()
      FROM marked m
     WHERE m.state = 'DEAD' AND s.id = m.submission_id AND s.generation = m.generation
       AND s.status = 'PENDING'
), q AS (
    SELECT mode, watermark, paused, config_version, class_shares AS shares,
           cardinality(classes) AS classes
      FROM judgequeue.queues WHERE name = $8
), picked AS (
    -- The classes in the claim's plan (judgequeue.claim_plan: each class with a share for its share
    -- of the $9 rows, then all by rank), each walked along outbox_claim: within a class, keys in
    -- turn (fair_seq), then readiness. The nested loop stops once $9 rows are locked.
-- include: claim_walk queue=$8 rows=$9 ready:
           -- With direct intake, live rows are left to the workers for $11 seconds (the hand-off),
           -- and in a queue with several classes for good: the takes keep the classes' order and
           -- shares, which the stream's FIFO (read before the outbox) would not.
           AND o.next_attempt_at <= now() - make_interval(
                   secs => CASE WHEN (SELECT mode FROM q) = 'live' THEN $11::float8 ELSE 0 END)
           AND ($11::float8 = 0 OR (SELECT mode FROM q) <> 'live' OR (SELECT classes FROM q) = 1)
           AND NOT coalesce((SELECT paused FROM q), true)
           AND o.id <> ALL($1::bigint[])  -- marked above: one statement never updates a row twice
-- end: claim_walk
), claimed AS (
    UPDATE judgequeue.outbox o
       SET state = CASE WHEN q.mode = 'live' AND q.watermark IS NOT NULL AND o.created_at < q.watermark
                        THEN 'SKIPPED' ELSE 'CLAIMED' END,
           sent_at = CASE WHEN q.mode = 'live' AND q.watermark IS NOT NULL AND o.created_at < q.watermark
                          THEN now() ELSE NULL END,
           attempts = o.attempts + 1,
           claimed_by = $7,
           claim_expires_at = now() + make_interval(secs => $10),
           next_attempt_at = now() + make_interval(secs => $10)
      FROM q, no_flush_wait
     WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING o.id, o.submission_id, o.generation, o.created_at, o.attempts, o.state, q.mode, q.config_version,
              extract(epoch FROM now() - o.created_at)::float8 AS age, o.class_rank, o.fair_seq
)
SELECT false AS claimed, id, state, NULL::bigint AS submission_id, NULL::bigint AS generation,
       NULL::timestamptz AS created_at, NULL::integer AS attempts, NULL::text AS mode,
       NULL::bigint AS config_version, NULL::float8 AS age, NULL::smallint AS class_rank, NULL::bigint AS fair_seq
  FROM marked
UNION ALL
SELECT true, id, state, submission_id, generation, created_at, attempts, mode, config_version, age, class_rank, fair_seq
  FROM claimed

-- name: outbox_prune
-- Delete a batch of a queue's terminal outbox rows older than the retention; $4 = states.TERMINAL_OUTBOX_STATES.
WITH doomed AS (
    SELECT id FROM judgequeue.outbox
     WHERE queue = $3
       AND state = ANY($4::text[])
       AND sent_at < now() - make_interval(secs => $1)
     ORDER BY id
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM judgequeue.outbox o USING doomed WHERE o.id = doomed.id

-- fragment: prune_ended
-- Delete a batch of $2 of queue $3's rows in a final status ($4) that ended more than $1 seconds ago, oldest first.
WITH doomed AS (
    SELECT {{key}} FROM judgequeue.{{table}}
     WHERE queue = $3
       AND {{ended}} IS NOT NULL
       AND {{ended}} < now() - make_interval(secs => $1)
       AND status = ANY($4::text[])
     ORDER BY {{ended}}
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM judgequeue.{{table}} {{alias}} USING doomed WHERE {{alias}}.{{key}} = doomed.{{key}}

-- name: submissions_prune
-- Delete a batch of a queue's terminal submissions finished before the retention, oldest first; $4 = states.ENDED_STATUSES.
-- include: prune_ended table=submissions alias=s key=id ended=finished_at

-- name: outbox_waiting_stats
-- PENDING/CLAIMED counts and the oldest waiting row's age; the literal list is outbox_claim's partial index predicate.
SELECT count(*) FILTER (WHERE state = 'PENDING') AS pending,
       count(*) FILTER (WHERE state = 'CLAIMED') AS claimed,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS age
  FROM judgequeue.outbox WHERE queue = $1 AND state IN ('PENDING', 'CLAIMED')

-- name: outbox_waiting_by_class
-- Per declared class of a queue (highest first): its waiting rows and the oldest one's age; the literal list is outbox_claim's predicate.
SELECT c.name, (c.ord - 1)::int AS rank, coalesce(w.waiting, 0)::bigint AS waiting, coalesce(w.age, 0)::float8 AS age
  FROM judgequeue.queues q
 CROSS JOIN unnest(q.classes) WITH ORDINALITY AS c(name, ord)
  LEFT JOIN (
      SELECT o.class_rank, count(*) AS waiting, extract(epoch FROM now() - min(o.created_at)) AS age
        FROM judgequeue.outbox o
       WHERE o.queue = $1 AND o.state IN ('PENDING', 'CLAIMED')
       GROUP BY o.class_rank
  ) w ON w.class_rank = c.ord - 1
 WHERE q.name = $1
 ORDER BY c.ord

-- name: outbox_other_stats
-- Row counts of a queue's outbox by state, for states not in $2 (states.WAITING_OUTBOX_STATES).
SELECT state, count(*) AS n FROM judgequeue.outbox WHERE queue = $1 AND state <> ALL($2::text[]) GROUP BY state

-- name: outbox_find_stranded
-- Deliveries sent long ago whose submission was never leased (reads only).
SELECT o.id, o.submission_id, o.generation
  FROM judgequeue.submissions s
  JOIN judgequeue.outbox o ON o.submission_id = s.id AND o.generation = s.generation

     WHERE s.queue = $1 AND s.status = 'PENDING' AND s.attempt_id IS NULL
       AND s.created_at < now() - make_interval(secs => $2)
       AND o.state = 'SENT' AND o.sent_at < now() - make_interval(secs => $2)

 ORDER BY s.created_at
 LIMIT $3

-- name: outbox_resend_stranded
-- Put such deliveries back to PENDING ($4: only these outbox ids, or NULL).
WITH stranded AS (
    SELECT o.id
      FROM judgequeue.submissions s
      JOIN judgequeue.outbox o ON o.submission_id = s.id AND o.generation = s.generation

     WHERE s.queue = $1 AND s.status = 'PENDING' AND s.attempt_id IS NULL
       AND s.created_at < now() - make_interval(secs => $2)
       AND o.state = 'SENT' AND o.sent_at < now() - make_interval(secs => $2)

       AND ($4::bigint[] IS NULL OR o.id = ANY($4::bigint[]))
     ORDER BY s.created_at
     LIMIT $3
       FOR UPDATE OF o SKIP LOCKED
)
UPDATE judgequeue.outbox o
   SET state = 'PENDING',
       next_attempt_at = now(),
       sent_at = NULL,
       last_error = format('re-sent: sent %s ago and never leased (stream entry lost?)',
                           date_trunc('second', now() - o.sent_at))
  FROM stranded
 WHERE o.id = stranded.id
RETURNING o.id

-- name: waiter_register
-- A dispatcher is about to sleep on the wake-up channel.
INSERT INTO judgequeue.dispatch_waiters (queue, dispatcher) VALUES ($1, $2)
ON CONFLICT (queue, dispatcher) DO UPDATE SET since = now()

-- name: waiter_unregister
-- A dispatcher woke up.
DELETE FROM judgequeue.dispatch_waiters WHERE queue = $1 AND dispatcher = $2

-- name: tables_never_analyzed
-- The take's tables that have taken $1 or more writes but were never analysed (a new database).
SELECT relname::text AS name FROM pg_stat_user_tables
 WHERE schemaname = 'judgequeue' AND relname IN ('outbox', 'submissions')
   AND last_analyze IS NULL AND last_autoanalyze IS NULL AND n_mod_since_analyze >= $1
 ORDER BY relname

-- name: analyze_outbox
-- Statistics for the planner (see outbox.analyze_new_tables).
ANALYZE judgequeue.outbox

-- name: analyze_submissions
-- Statistics for the planner (see outbox.analyze_new_tables).
ANALYZE judgequeue.submissions

-- name: waiter_prune
-- Forget waiters of crashed dispatchers.
DELETE FROM judgequeue.dispatch_waiters WHERE since < now() - make_interval(secs => $1)

-- name: lease_acquire
-- Take leases PENDING -> JUDGING by primary key (hot path: keep text and plan).
WITH no_flush_wait AS MATERIALIZED (
    -- SET LOCAL for this statement's own transaction: its commit does not wait for the WAL flush
    -- (see make_durable for why that is safe).
    SELECT set_config('synchronous_commit', 'off', true)
)
UPDATE judgequeue.submissions s
   SET status = 'JUDGING',
       attempt_id = e.attempt,
       lease_expires_at = now() + make_interval(secs => $5::float8)
  FROM unnest($1::bigint[], $2::bigint[], $3::uuid[]) AS e(id, generation, attempt), no_flush_wait
 WHERE s.id = ANY($1::bigint[])  -- a primary-key lookup whatever the backlog's size
   AND s.id = e.id AND s.generation = e.generation AND s.status = 'PENDING' AND s.queue = $4
RETURNING s.id, s.generation, s.attempt_id, s.payload::text AS payload, s.created_at, s.request_generation,
          s.call_failures

-- name: lease_direct
-- Direct intake (JUDGEQUEUE_INTAKE=direct): claim a live queue's ready outbox rows, mark them sent
-- to this worker and lease their submissions, in one statement and commit (no stream entry, so no
-- ack). A crash loses the claim and the lease together (the row is claimed again) or neither (the
-- reaper rescues the expired lease). One row per claimed outbox row: leased, or skipped (before the
-- watermark) or stale (its submission moved on) with NULL lease columns; each says whether the queue
-- is live and whether this statement registered the worker as a waiter.
-- The worker's wake-up registration rides along ($5, $6: never both): $5 unregisters it if rows
-- were ready (work is flowing: submitters need not notify), $6 registers it if nothing was ready on
-- a live queue (the worker then looks once more before it sleeps: rows committed before this
-- registration sent no notification). The waiter table is unlogged, so an empty take that
-- registers still commits without a WAL flush.
-- Each update reaches its rows by primary key (= ANY of an array) whatever the planner thinks the
-- LIMIT is: a generic plan that guessed a large claim used to hash-join a sequential scan of the
-- whole outbox. Hot path: keep text and plan.
WITH no_flush_wait AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
), q AS (
    SELECT mode = 'live' AND NOT paused AS live, watermark, class_shares AS shares
      FROM judgequeue.queues WHERE name = $1
), picked AS (
    -- The classes in the claim's plan, each along outbox_claim (as in outbox_mark_claim).
-- include: claim_walk queue=$1 rows=$3 ready:
           AND o.next_attempt_at <= now()
           AND coalesce((SELECT live FROM q), false)  -- shadow rows are the dispatcher's
-- end: claim_walk
), sent AS (
    UPDATE judgequeue.outbox o
       SET state = CASE WHEN q.watermark IS NOT NULL AND o.created_at < q.watermark THEN 'SKIPPED' ELSE 'SENT' END,
           sent_at = now(),
           attempts = o.attempts + 1,
           claimed_by = $2,
           claim_expires_at = NULL
      FROM q, no_flush_wait
     WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING o.id, o.state, o.submission_id, o.generation
), leased AS (
    UPDATE judgequeue.submissions s
       SET status = 'JUDGING',
           attempt_id = gen_random_uuid(),
           lease_expires_at = now() + make_interval(secs => $4::float8)
      FROM sent
     WHERE s.id = ANY(ARRAY(SELECT submission_id FROM sent WHERE state = 'SENT'))
       AND sent.state = 'SENT' AND s.id = sent.submission_id AND s.generation = sent.generation
       AND s.status = 'PENDING' AND s.queue = $1
    RETURNING s.id, s.generation, s.attempt_id, s.payload::text AS payload, s.created_at, s.request_generation,
              s.call_failures
), unregistered AS (
    DELETE FROM judgequeue.dispatch_waiters
     WHERE $5 AND queue = $1 AND dispatcher = $2 AND EXISTS (SELECT 1 FROM picked)
    RETURNING true
), registered AS (
    INSERT INTO judgequeue.dispatch_waiters (queue, dispatcher)
    SELECT $1, $2
     WHERE $6 AND NOT $5 AND coalesce((SELECT live FROM q), false) AND NOT EXISTS (SELECT 1 FROM picked)
    ON CONFLICT (queue, dispatcher) DO UPDATE SET since = now()
    RETURNING true
), flags AS (
    SELECT coalesce((SELECT live FROM q), false) AS live, EXISTS (SELECT 1 FROM registered) AS registered,
           EXISTS (SELECT 1 FROM unregistered) AS unregistered,
           coalesce((SELECT cardinality(shares) FROM q), 1) AS classes
)
-- Always one row at least: with nothing claimed, a row of NULLs that still carries the flags (a
-- worker of a paused or shadow queue polls instead of asking submits to notify it) and the number
-- of the queue's classes (with several, the worker keeps reserved offers for the first).
SELECT flags.live, flags.registered, flags.unregistered, flags.classes, t.outbox_state, t.submission_id, t.outbox_generation, t.attempt_id,
       t.payload, t.created_at, t.request_generation, t.call_failures
  FROM flags
  LEFT JOIN (
      SELECT sent.id, sent.state AS outbox_state, sent.submission_id, sent.generation AS outbox_generation,
             leased.attempt_id, leased.payload, leased.created_at, leased.request_generation, leased.call_failures
        FROM sent LEFT JOIN leased ON leased.id = sent.submission_id AND leased.generation = sent.generation
  ) t ON true
 ORDER BY t.id

-- name: offers_sync
-- A worker's offers in one statement. Its filled offers whose job it has (the
-- pairs of slots $7 and attempts $9, seen) are opened again if their slot is among the slots it
-- opens now ($6), else deleted; a slot filled again since (another attempt) is left alone, so a
-- pair sent again after a lost answer touches nothing new. The other slots in $6 are added if
-- missing, those numbered $11 and up as reserved offers (max_rank 0: first-class jobs only, see
-- judgequeue.submit()), and with $10 (refresh, about once a second) every open offer stays alive
-- for $5 seconds more (a top-up between refreshes touches only the slots it opens). With $8
-- (withdraw): its open offers not in $6 are deleted, and $6 lists every slot it keeps (its reserved
-- ones; with $10 they are refreshed). Open offers a submit is filling at this moment are left alone
-- either way. Returns,
-- by kind: the withdrawn slots; every filled offer not seen, with the job where its lease still
-- stands (a notification lost with a connection is made up here) or NULLs where it does not; and
-- every slot of the worker's in the table, as of before the statement plus those it added.
-- Filling and re-opening only change unindexed columns: the table and its index stay the size of
-- the offers, however many jobs pass through them. While it opens or keeps offers, the queue's
-- offers_until (which judgequeue.submit() reads) is kept at or past the expiry this statement gives
-- any offer: when it would end within $5 seconds it moves to 2 * $5 from now, so the workers of a
-- queue write its row about once per $5 seconds between them, not once per refresh each; one that
-- finds the row locked (another worker's write, a flip) leaves it, the next sync tries again. A
-- withdrawal that keeps nothing, when no other worker of the queue has an unexpired open offer,
-- brings offers_until back to now(): a worker stops offering when the submits outrun its offers,
-- and from then on they stop looking for one (instead of for up to 2 * $5 more seconds); an offer
-- opened meanwhile by another worker, whose insert this statement cannot see yet, waits for that
-- worker's next refresh to be fillable, and its worker (registered while it offers) is woken by the
-- submits' PENDING rows in the meantime.
WITH seen AS (
    SELECT slot, attempt FROM unnest($7::int[], $9::uuid[]) AS s(slot, attempt)
), added AS (
    INSERT INTO judgequeue.worker_offers (queue, worker, slot, channel, lease_ttl, expires_at, max_rank)
    SELECT $1, $2, s, $3, $4::float8, now() + make_interval(secs => $5::float8), CASE WHEN s >= $11 THEN 0 END
      FROM unnest($6::int[]) AS s
     WHERE s <> ALL($7::int[])
    ON CONFLICT (queue, worker, slot) DO NOTHING
    RETURNING slot
), reopened AS (
    UPDATE judgequeue.worker_offers o
       SET submission = NULL, attempt = NULL, channel = $3, lease_ttl = $4::float8,
           expires_at = now() + make_interval(secs => $5::float8)
      FROM seen
     WHERE o.queue = $1 AND o.worker = $2 AND o.slot = seen.slot AND o.attempt = seen.attempt
       AND o.slot = ANY($6::int[])
), forgotten AS (
    DELETE FROM judgequeue.worker_offers o
     USING seen
     WHERE o.queue = $1 AND o.worker = $2 AND o.slot = seen.slot AND o.attempt = seen.attempt
       AND o.slot <> ALL($6::int[])
), open_now AS (
    SELECT slot FROM judgequeue.worker_offers
     WHERE ($8 OR $10) AND queue = $1 AND worker = $2 AND submission IS NULL
       FOR UPDATE SKIP LOCKED
), kept AS (
    UPDATE judgequeue.worker_offers o
       SET expires_at = now() + make_interval(secs => $5::float8)
      FROM open_now
     WHERE $10 AND (NOT $8 OR o.slot = ANY($6::int[])) AND o.queue = $1 AND o.worker = $2
       AND o.slot = open_now.slot
), gone AS (
    DELETE FROM judgequeue.worker_offers o
     USING open_now
     WHERE $8 AND o.slot <> ALL($6::int[]) AND o.queue = $1 AND o.worker = $2 AND o.slot = open_now.slot
    RETURNING o.slot
), signal AS (
    -- Opening or keeping offers: forward once due. Withdrawing the queue's last open offer: back to now.
    UPDATE judgequeue.queues q
       SET offers_until = CASE WHEN $8 AND cardinality($6::int[]) = 0 THEN now()
                               ELSE now() + make_interval(secs => 2 * $5::float8) END
     WHERE q.name = (SELECT name FROM judgequeue.queues
                      WHERE name = $1
                        AND CASE WHEN $8 AND cardinality($6::int[]) = 0
                                 THEN offers_until > now()
                                      AND NOT EXISTS (SELECT 1 FROM judgequeue.worker_offers o
                                                       WHERE o.queue = $1 AND o.worker <> $2
                                                         AND o.submission IS NULL AND o.expires_at > now())
                                 ELSE ($10 OR cardinality($6::int[]) > 0)
                                      AND (offers_until IS NULL
                                           OR offers_until < now() + make_interval(secs => $5::float8))
                            END
                        FOR NO KEY UPDATE SKIP LOCKED)
)
SELECT 'withdrawn' AS kind, slot, NULL::bigint AS submission, NULL::uuid AS attempt, NULL::text AS payload,
       NULL::timestamptz AS created_at
  FROM gone
UNION ALL
SELECT 'filled', o.slot, o.submission, o.attempt, s.payload::text, s.created_at
  FROM judgequeue.worker_offers o
  LEFT JOIN judgequeue.submissions s
         ON s.id = o.submission AND s.attempt_id = o.attempt AND s.status = 'JUDGING'
 WHERE o.queue = $1 AND o.worker = $2 AND o.submission IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.slot = o.slot AND seen.attempt = o.attempt)
UNION ALL
SELECT 'present', slot, NULL, NULL, NULL, NULL FROM judgequeue.worker_offers WHERE queue = $1 AND worker = $2
UNION ALL
SELECT 'present', slot, NULL, NULL, NULL, NULL FROM added

-- name: notify_queue_usage
-- The fraction of Postgres's notification queue in use (0..1): a listener that stops reading (a
-- session idle in a transaction that ran LISTEN) keeps every later notification queued; at 1 every
-- NOTIFY fails, submits that fill offers or wake workers included.
SELECT pg_notification_queue_usage()

-- name: offers_prune
-- Forget offers their worker stopped refreshing $1 seconds ago (a crashed worker's; a filled one's
-- job has its own lease, which the reaper rescues when it expires).
DELETE FROM judgequeue.worker_offers WHERE expires_at < now() - make_interval(secs => $1)

-- name: lease_renew
-- Extend live leases under their fence (heartbeat).
UPDATE judgequeue.submissions s
   SET lease_expires_at = now() + make_interval(secs => $4::float8)
  FROM unnest($1::bigint[], $2::bigint[], $3::uuid[]) AS l(id, generation, attempt)
 WHERE s.id = ANY($1::bigint[])
   AND s.id = l.id AND s.generation = l.generation AND s.attempt_id = l.attempt AND s.status = 'JUDGING'
RETURNING s.attempt_id

-- name: lease_verdict
-- Write verdicts fenced on (id, generation, attempt, JUDGING) (hot path: keep text and plan).
UPDATE judgequeue.submissions s
   SET status = v.status,
       verdict = v.verdict,
       lease_expires_at = NULL,
       finished_at = now()
  FROM unnest($1::bigint[], $2::bigint[], $3::uuid[], $4::text[], $5::jsonb[])
       AS v(id, generation, attempt, status, verdict)
 WHERE s.id = ANY($1::bigint[])
   AND s.id = v.id AND s.generation = v.generation AND s.attempt_id = v.attempt AND s.status = 'JUDGING'
RETURNING s.attempt_id, extract(epoch FROM now() - s.created_at)::float8 AS end_to_end

-- name: lease_make_durable
-- A transactional WAL record whose synchronous commit flushes every earlier lazy commit.
SELECT pg_logical_emit_message(true, 'judgequeue', 'leases'),
       CASE WHEN current_setting('synchronous_commit') = 'off'
            THEN set_config('synchronous_commit', 'on', true) END

-- name: lease_release
-- Give leases back (PENDING, same generation) so another worker can take them.
SELECT judgequeue.release_leases($1::bigint[], $2::bigint[], $3::uuid[]) AS id

-- name: lease_defer
-- Give a lease back to be tried again after $4 seconds; NULL when it was not held.
SELECT judgequeue.defer_lease($1::bigint, $2::bigint, $3::uuid, $4::float8, $5::boolean, $6::text) AS generation

-- name: lease_rescue_expired
-- Requeue or fail a batch of expired leases on the database clock.
SELECT requeued, failed FROM judgequeue.rescue_expired_leases($1, $2, $3)

-- name: lease_stale_reasons
-- The current generation and status of each (id, generation) pair, in order.
SELECT e.id, e.generation, s.generation AS current_generation, s.status
  FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS e(id, generation, n)
  LEFT JOIN judgequeue.submissions s ON s.id = e.id
 ORDER BY e.n

-- name: submissions_read
-- The rows of these submissions (ids as a bigint array).
SELECT id, status, generation, verdict, created_at, finished_at FROM judgequeue.submissions WHERE id = any($1::bigint[])

-- name: submissions_count_by_status
-- A queue's submissions counted by status.
SELECT status, count(*) AS n FROM judgequeue.submissions WHERE queue = $1 GROUP BY 1

-- name: submissions_finished_since
-- How many of a queue's submissions finished in the last $2 seconds.
SELECT count(*) FROM judgequeue.submissions WHERE queue = $1 AND finished_at > now() - make_interval(secs => $2)

-- name: submission_exists
-- True when the submission exists, else no row.
SELECT true FROM judgequeue.submissions WHERE id = $1

-- name: submission_bump_generation
-- New generation of a submission still at $2 (a DLQ replay); NULL when superseded or unknown.
SELECT judgequeue.bump_generation($1::bigint, $2::bigint, false)

-- name: record_dead_letters
-- Record in Postgres why entries were dead-lettered, before they reach the DLQ.
SELECT ord, outcome FROM judgequeue.record_dead_letters($1::bigint[], $2::bigint[], $3::text[])

-- name: queue_set_classes
-- Declare a queue's classes (highest first) and shares; the CHECK refuses invalid ones.
UPDATE judgequeue.queues SET classes = $2::text[], class_shares = $3::smallint[]
 WHERE name = $1 AND (classes, class_shares) IS DISTINCT FROM ($2::text[], $3::smallint[])
RETURNING true

-- name: queue_classes
-- A queue's classes and shares.
SELECT classes, class_shares FROM judgequeue.queues WHERE name = $1

-- name: queue_create
-- Create a queue if it does not exist; an existing queue keeps its flags.
INSERT INTO judgequeue.queues (name, mode) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING

-- name: queue_get
-- One queue's flags and owner.
SELECT name, mode, watermark, paused, config_version, updated_at, owner FROM judgequeue.queues WHERE name = $1

-- name: queue_list
-- Every queue's flags and owner.
SELECT name, mode, watermark, paused, config_version, updated_at, owner FROM judgequeue.queues ORDER BY name

-- name: queue_claim
-- Create a queue owned by $3, or claim an existing one nobody owns (flags kept); returns nothing
-- when another owner holds it. An existing row already owned by $3 is not rewritten.
INSERT INTO judgequeue.queues AS q (name, mode, owner) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner WHERE q.owner IS NULL
RETURNING name, mode, watermark, paused, config_version, updated_at, owner

-- name: queue_release
-- Give up a queue's ownership, only if $2 holds it; returns whether it did.
UPDATE judgequeue.queues SET owner = NULL WHERE name = $1 AND owner = $2 RETURNING true

-- name: queue_owned_by
-- The queues $1 owns, by name.
SELECT name FROM judgequeue.queues WHERE owner = $1 ORDER BY name

-- name: queue_take_back
-- Make $2 the owner again of a queue whose owner column was set to $3 outside the operator (only
-- while $3 holds it); returns whether it did.
UPDATE judgequeue.queues SET owner = $2 WHERE name = $1 AND owner = $3 RETURNING true

-- name: queue_flip_wait
-- How long a flag flip waits for submit transactions that filled workers' offers
-- before it gives up, until the end of the transaction (set_cutover puts the old value back);
-- returns the old value.
SELECT current_setting('lock_timeout') AS old, set_config('lock_timeout', $1, true) AS new

-- name: queue_flip_lock
-- Take the flip's side of the offers interlock before the queue row is locked (a waiting flip then
-- holds no row lock): it waits for submits that filled offers to commit.
SELECT pg_advisory_xact_lock(judgequeue.offers_lock_key($1))

-- name: queue_flip_blockers
-- Sessions holding the offers interlock of a queue (submits that filled offers, not yet committed).
SELECT count(*)::int, coalesce(max(extract(epoch FROM now() - a.xact_start)), 0)::float8
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND ((l.classid::bigint << 32) | l.objid::bigint) = judgequeue.offers_lock_key($1) AND l.objsubid = 1

-- name: queue_set_cutover
-- Change any of a queue's flags in one statement (the watermark trigger refuses moving it back);
-- with $6 (an owner) only while $6 owns the queue.
UPDATE judgequeue.queues
   SET mode = coalesce($2, mode),
       watermark = CASE WHEN $3 THEN $4 ELSE watermark END,
       paused = coalesce($5, paused)
 WHERE name = $1 AND ($6::text IS NULL OR owner = $6)
RETURNING name, mode, watermark, paused, config_version, updated_at, owner

-- name: shadow_acquire
-- Take shadow leases for (submission, generation) pairs of a queue: a new row, a row of an older generation, or one whose lease expired or waits for a delivery.
WITH no_flush_wait AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
), src AS (
    SELECT DISTINCT ON (s.id) s.id, s.generation, e.attempt, s.payload, s.created_at
      FROM judgequeue.submissions s
      JOIN unnest($1::bigint[], $2::bigint[], $3::uuid[]) WITH ORDINALITY AS e(id, generation, attempt, n)
        ON s.id = e.id AND s.generation = e.generation
     WHERE s.id = ANY($1::bigint[]) AND s.queue = $4
     ORDER BY s.id, e.n
), taken AS (
    INSERT INTO judgequeue.shadow_verdicts AS v
           (submission_id, queue, generation, attempt, status, worker, lease_expires_at, started_at)
    SELECT src.id, $4, src.generation, src.attempt, 'JUDGING', $6, now() + make_interval(secs => $5::float8), now()
      FROM src, no_flush_wait
    ON CONFLICT (submission_id) DO UPDATE
       SET generation = excluded.generation, attempt = excluded.attempt, status = 'JUDGING', details = NULL,
           worker = excluded.worker, lease_expires_at = excluded.lease_expires_at, started_at = now(),
           judged_at = NULL,
           retry_count = CASE WHEN v.generation = excluded.generation THEN v.retry_count ELSE 0 END
     WHERE v.generation < excluded.generation
        OR (v.generation = excluded.generation AND v.status = 'JUDGING'
            AND (v.attempt IS NULL OR v.lease_expires_at < now()))
    RETURNING v.submission_id, v.generation, v.attempt
)
SELECT t.submission_id AS id, t.generation, t.attempt AS attempt_id, src.payload::text AS payload, src.created_at
  FROM taken t JOIN src ON src.id = t.submission_id

-- name: shadow_renew
-- Extend shadow leases still held under their fence (a shadow worker's heartbeat); a rejudge (the submission's generation moved) ends them.
UPDATE judgequeue.shadow_verdicts v
   SET lease_expires_at = now() + make_interval(secs => $4::float8)
  FROM unnest($1::bigint[], $2::bigint[], $3::uuid[]) AS l(id, generation, attempt), judgequeue.submissions s
 WHERE v.submission_id = ANY($1::bigint[])
   AND v.submission_id = l.id AND v.generation = l.generation AND v.attempt = l.attempt AND v.status = 'JUDGING'
   AND s.id = v.submission_id AND s.generation = v.generation
RETURNING v.attempt AS attempt_id

-- name: shadow_verdict
-- Write shadow verdicts fenced on (submission, generation, attempt, JUDGING) and the submission's own generation; the details are the verdict document's.
UPDATE judgequeue.shadow_verdicts v
   SET status = w.status,
       details = w.doc -> 'details',
       lease_expires_at = NULL,
       judged_at = now()
  FROM unnest($1::bigint[], $2::bigint[], $3::uuid[], $4::text[], $5::jsonb[]) AS w(id, generation, attempt, status, doc),
       judgequeue.submissions s
 WHERE v.submission_id = ANY($1::bigint[])
   AND v.submission_id = w.id AND v.generation = w.generation AND v.attempt = w.attempt AND v.status = 'JUDGING'
   AND s.id = v.submission_id AND s.generation = v.generation
RETURNING v.attempt AS attempt_id, extract(epoch FROM now() - v.started_at)::float8 AS seconds

-- name: shadow_release
-- Give shadow leases back (a stopping worker): expired at once, waiting for the reaper to send them again.
UPDATE judgequeue.shadow_verdicts v
   SET attempt = NULL, lease_expires_at = now()
  FROM unnest($1::bigint[], $2::bigint[], $3::uuid[]) AS l(id, generation, attempt)
 WHERE v.submission_id = ANY($1::bigint[])
   AND v.submission_id = l.id AND v.generation = l.generation AND v.attempt = l.attempt AND v.status = 'JUDGING'
RETURNING v.submission_id AS id

-- name: shadow_stale_reasons
-- The submission's current generation and its shadow row's generation and status, per (id, generation) pair, in order.
SELECT e.id, e.generation, s.generation AS current_generation, v.generation AS shadow_generation,
       v.status AS shadow_status
  FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS e(id, generation, n)
  LEFT JOIN judgequeue.submissions s ON s.id = e.id
  LEFT JOIN judgequeue.shadow_verdicts v ON v.submission_id = e.id
 ORDER BY e.n

-- name: shadow_rescue_expired
-- Expired shadow leases of a queue: sent again (attempt NULL, resend in $4 s if no delivery takes it), or SYSTEM_ERROR at $2 expiries.
WITH doomed AS (
    SELECT submission_id
      FROM judgequeue.shadow_verdicts
     WHERE status = 'JUDGING' AND lease_expires_at < now() AND queue = $1
     ORDER BY lease_expires_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), failed AS (
    UPDATE judgequeue.shadow_verdicts v
       SET status = 'SYSTEM_ERROR', attempt = NULL, lease_expires_at = NULL, judged_at = now(),
           retry_count = v.retry_count + 1,
           details = jsonb_build_object('reason', format('shadow judging gave up after %s lease expiries',
                                                         v.retry_count + 1))
      FROM doomed d
     WHERE v.submission_id = d.submission_id AND v.retry_count + 1 >= $2
    RETURNING v.submission_id, v.generation
), resent AS (
    UPDATE judgequeue.shadow_verdicts v
       SET attempt = NULL, retry_count = v.retry_count + 1,
           lease_expires_at = now() + make_interval(secs => $4::float8)
      FROM doomed d
     WHERE v.submission_id = d.submission_id AND v.retry_count + 1 < $2
    RETURNING v.submission_id, v.generation
)
SELECT 'resend' AS outcome, r.submission_id, r.generation, coalesce(o.id, 0) AS outbox_id,
       coalesce(o.attempts, 0) AS attempts
  FROM resent r
  LEFT JOIN judgequeue.outbox o ON o.submission_id = r.submission_id AND o.generation = r.generation
UNION ALL
SELECT 'failed', f.submission_id, f.generation, 0, 0 FROM failed f

-- name: shadow_give_up
-- Give up shadow-judging (submission, generation) pairs: a SYSTEM_ERROR shadow verdict with the reason, unless a held lease or a final verdict of that generation has the row; one outcome per pair.
WITH input AS (
    SELECT i.id, i.generation, i.reason, i.ord
      FROM unnest($1::bigint[], $2::bigint[], $3::text[]) WITH ORDINALITY AS i(id, generation, reason, ord)
), src AS (
    SELECT DISTINCT ON (i.id) i.id, i.generation, i.reason, s.queue
      FROM input i JOIN judgequeue.submissions s ON s.id = i.id AND s.generation = i.generation
     ORDER BY i.id, i.ord
), failed AS (
    INSERT INTO judgequeue.shadow_verdicts AS v (submission_id, queue, generation, status, details, judged_at)
    SELECT src.id, src.queue, src.generation, 'SYSTEM_ERROR', jsonb_build_object('reason', src.reason), now()
      FROM src
    ON CONFLICT (submission_id) DO UPDATE
       SET generation = excluded.generation, status = 'SYSTEM_ERROR', details = excluded.details, attempt = NULL,
           worker = NULL, lease_expires_at = NULL, judged_at = now(),
           retry_count = CASE WHEN v.generation = excluded.generation THEN v.retry_count ELSE 0 END
     WHERE v.generation < excluded.generation
        OR (v.generation = excluded.generation AND v.status = 'JUDGING'
            AND (v.attempt IS NULL OR v.lease_expires_at < now()))
    RETURNING v.submission_id
)
SELECT i.ord,
       CASE
           WHEN f.submission_id IS NOT NULL THEN 'recorded'
           WHEN s.id IS NULL THEN 'unknown'
           WHEN s.generation <> i.generation THEN 'superseded'
           WHEN v.status IS NULL THEN 'unknown'
           ELSE lower(v.status)
       END AS outcome
  FROM input i
  LEFT JOIN failed f ON f.submission_id = i.id
  LEFT JOIN judgequeue.submissions s ON s.id = i.id
  LEFT JOIN judgequeue.shadow_verdicts v ON v.submission_id = i.id
 ORDER BY i.ord

-- name: report_legacy_verdict
-- Record the legacy judge's verdict of a submission in the caller's transaction (refusals: JQ003, JQ006-JQ008).
SELECT judgequeue.report_legacy_verdict($1::bigint, $2::text, $3::jsonb)

-- name: shadow_agreement
-- A queue's legacy and final shadow verdicts paired by submission, counted by their two statuses (NULL: absent); $2 = states.VERDICTS.
WITH l AS (
    SELECT submission_id, status FROM judgequeue.legacy_verdicts WHERE queue = $1
), s AS (
    SELECT submission_id, status FROM judgequeue.shadow_verdicts WHERE queue = $1 AND status = ANY($2::text[])
)
SELECT l.status AS legacy, s.status AS shadow, count(*)::bigint AS n
  FROM l FULL JOIN s USING (submission_id)
 GROUP BY 1, 2

-- name: shadow_mismatches
-- Submissions whose legacy and final shadow verdicts differ in status (agreement.agree in SQL), newest first; $1 NULL: every queue.
SELECT l.submission_id, l.queue, v.generation, l.status AS legacy_status, l.details::text AS legacy_details,
       l.reported_at, v.status AS shadow_status, v.details::text AS shadow_details, v.judged_at
  FROM judgequeue.legacy_verdicts l
  JOIN judgequeue.shadow_verdicts v ON v.submission_id = l.submission_id
 WHERE ($1::text IS NULL OR l.queue = $1)
   AND v.status = ANY($2::text[])
   AND v.status <> l.status
 ORDER BY greatest(l.reported_at, v.judged_at) DESC, l.submission_id DESC
 LIMIT $3

-- name: shadow_verdicts_prune
-- Delete a batch of a queue's final shadow verdicts judged before the retention, oldest first; $4 = states.VERDICTS.
-- include: prune_ended table=shadow_verdicts alias=v key=submission_id ended=judged_at

-- name: legacy_verdicts_prune
-- Delete a batch of a queue's legacy verdicts reported before the retention, oldest first.
WITH doomed AS (
    SELECT submission_id FROM judgequeue.legacy_verdicts
     WHERE queue = $3
       AND reported_at < now() - make_interval(secs => $1)
     ORDER BY reported_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM judgequeue.legacy_verdicts l USING doomed WHERE l.submission_id = doomed.submission_id

-- name: problem_file_exists
-- True when a package file is stored.
SELECT true FROM judgequeue.problem_files WHERE sha256 = $1

-- name: problem_file_insert
-- Store a package file's header; no row when it is stored already.
INSERT INTO judgequeue.problem_files (sha256, size, chunks) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING
RETURNING true

-- name: problem_chunk_insert
-- Store one chunk of a package file.
INSERT INTO judgequeue.problem_chunks (sha256, seq, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING

-- name: problem_lock
-- Serialise uploads of one problem id for this transaction.
SELECT pg_advisory_xact_lock(hashtext('judgequeue.problems'), hashtext($1))

-- name: problem_next_version
-- The next version number of a problem.
SELECT coalesce(max(version), 0) + 1 FROM judgequeue.problems WHERE id = $1

-- name: problem_insert
-- Store a problem version; no row when that version exists.
INSERT INTO judgequeue.problems (id, version, manifest, sha256) VALUES ($1, $2, $3::jsonb, $4)
ON CONFLICT (id, version) DO NOTHING
RETURNING version

-- name: problem_get
-- A stored manifest and its digest.
SELECT manifest::text AS manifest, sha256 FROM judgequeue.problems WHERE id = $1 AND version = $2

-- name: problem_list
-- Every stored problem version.
SELECT id, version, sha256, created_at, jsonb_array_length(manifest->'tests') AS tests,
       (manifest->>'total_bytes')::bigint AS total_bytes
  FROM judgequeue.problems ORDER BY id, version

-- name: problem_chunks
-- A batch of a file's chunks from $2 on.
SELECT data FROM judgequeue.problem_chunks WHERE sha256 = $1 AND seq >= $2 ORDER BY seq LIMIT $3

-- name: db_now
-- The database clock (every time decision uses it).
SELECT now()

-- name: session_rights
-- Whether the login user is a superuser or holds the schema owner's role (a role warns: it needs neither).
SELECT r.rolsuper AS superuser,
       EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
                WHERE g.rolname = 'judgequeue_owner' AND m.member = r.oid) AS owner
  FROM pg_roles r
 WHERE r.rolname = session_user

-- name: ping
-- A readiness probe's round trip.
SELECT 1

-- fragment: events_horizon
-- The oldest transaction still running in this database (events_read, webhook_ingest): events before it are final.
    -- judgequeue.events_horizon()'s body, inlined: a prepared statement plans it once, where the
    -- SQL function is planned again at every call (about 0.5 ms of server CPU each)
    SELECT coalesce(
               (SELECT min(x) FROM pg_snapshot_xip(snap.s) AS x
                 WHERE (x::text::bigint % 4294967296) NOT IN (
                           SELECT backend_xid::text::bigint FROM pg_stat_activity
                            WHERE backend_xid IS NOT NULL AND datname IS DISTINCT FROM current_database())),
               pg_snapshot_xmax(snap.s)) AS h
      FROM (SELECT pg_current_snapshot() AS s) snap

-- name: events_read
-- Events after position ($1 txid, $2 id), of queue $3 (NULL: every queue) and kinds $5 (NULL: all), up to the oldest transaction still running here.
WITH horizon AS MATERIALIZED (
-- include: events_horizon
)
SELECT e.id, e.txid::text AS txid, e.queue, e.submission_id, e.generation, e.status, e.score, e.reason, e.created_at,
       e.kind, e.progress
  FROM judgequeue.verdict_events e
 WHERE (e.txid, e.id) > ($1::text::xid8, $2::bigint)
   AND e.txid < (SELECT h FROM horizon)
   AND ($3::text IS NULL OR e.queue = $3)
   AND ($5::text[] IS NULL OR e.kind = ANY($5::text[]))
 ORDER BY e.txid, e.id
 LIMIT $4

-- name: events_held
-- True when committed events of queue $1 (NULL: any) wait for an older transaction still running.
SELECT EXISTS (
    SELECT 1 FROM judgequeue.verdict_events e
     WHERE e.txid >= judgequeue.events_horizon()
       AND ($1::text IS NULL OR e.queue = $1))

-- name: events_head
-- The position after every event committed so far (a reader starting there sees only later events).
SELECT coalesce(max(txid), '0'::xid8)::text AS txid, coalesce(max(id), 0) AS id
  FROM (SELECT txid, id FROM judgequeue.verdict_events ORDER BY txid DESC, id DESC LIMIT 1) last

-- name: progress_record
-- Progress events of leases still held (none for a rejudging's probe), fenced like a verdict on (id, generation, attempt, JUDGING),
-- the submission locked shared so a verdict committing meanwhile refuses them; the attempts written.
WITH held AS (
    SELECT s.id, s.queue, s.generation, s.attempt_id, s.rejudging, p.progress
      FROM unnest($1::bigint[], $2::bigint[], $3::uuid[], $4::jsonb[]) AS p(id, generation, attempt, progress)
      JOIN judgequeue.submissions s
        ON s.id = p.id AND s.generation = p.generation AND s.attempt_id = p.attempt AND s.status = 'JUDGING'
     WHERE s.id = ANY($1::bigint[])
       FOR SHARE OF s
), added AS (
    INSERT INTO judgequeue.verdict_events (kind, queue, submission_id, generation, status, progress)
    SELECT 'progress', h.queue, h.id, h.generation, 'JUDGING', h.progress FROM held h
     WHERE h.rejudging IS NULL  -- a rejudging's probe is judged on the side: no events
     ORDER BY h.id
    RETURNING queue
), told AS (
    SELECT count(pg_notify('judgequeue_events', q.queue)) AS n FROM (SELECT DISTINCT queue FROM added) q
)
SELECT h.attempt_id FROM held h, told

-- fragment: prune_by_age
-- Delete a batch of $2 of queue $3's rows of a table made more than $1 seconds ago, oldest first (events, history, rejudgings).
WITH doomed AS (
    SELECT id FROM judgequeue.{{table}}
     WHERE queue = $3 AND created_at < now() - make_interval(secs => $1)
     ORDER BY created_at
     LIMIT $2
)
DELETE FROM judgequeue.{{table}} {{alias}} USING doomed WHERE {{alias}}.id = doomed.id

-- name: events_prune
-- Delete a batch of a queue's verdict events older than the retention, oldest first.
-- include: prune_by_age table=verdict_events alias=e

-- name: webhook_endpoint_ensure
-- Create a webhook endpoint's row (its read position starts before every retained event); returns its queue.
WITH made AS (
    INSERT INTO judgequeue.webhook_endpoints (name, queue) VALUES ($1, $2)
    ON CONFLICT (name) DO NOTHING
    RETURNING queue
)
SELECT queue FROM made UNION ALL SELECT queue FROM judgequeue.webhook_endpoints WHERE name = $1

-- name: webhook_ingest
-- Turn up to $2 events past endpoint $1's position into its deliveries and move the position, in one statement.
WITH ep AS (
    SELECT name, queue, after_txid, after_id FROM judgequeue.webhook_endpoints WHERE name = $1 FOR UPDATE
), horizon AS MATERIALIZED (
-- include: events_horizon
), batch AS (
    SELECT e.id, e.txid, e.queue, e.submission_id, e.generation, e.status, e.score, e.reason, e.created_at, e.kind
      FROM judgequeue.verdict_events e, ep
     WHERE (e.txid, e.id) > (ep.after_txid, ep.after_id)
       AND e.txid < (SELECT h FROM horizon)
       AND e.queue = ep.queue
     ORDER BY e.txid, e.id
     LIMIT $2
), added AS (
    INSERT INTO judgequeue.webhook_deliveries (endpoint, event_id, submission_id, generation, body)
    SELECT $1, b.id, b.submission_id, b.generation,
           jsonb_build_object('event', b.id, 'queue', b.queue, 'submission', b.submission_id,
                              'generation', b.generation, 'status', b.status, 'score', b.score,
                              'reason', b.reason, 'committed_at', b.created_at)
      FROM batch b
     WHERE b.kind = 'verdict'  -- progress is not delivered by webhook; the position moves past it
    ON CONFLICT (endpoint, event_id) DO NOTHING
    RETURNING event_id
), moved AS (
    UPDATE judgequeue.webhook_endpoints w
       SET after_txid = last.txid, after_id = last.id, read_at = now()
      FROM (SELECT txid, id FROM batch ORDER BY txid DESC, id DESC LIMIT 1) last
     WHERE w.name = $1
    RETURNING w.name
)
SELECT (SELECT count(*) FROM batch) AS read, (SELECT count(*) FROM added) AS added

-- name: webhook_claim
-- Claim up to $2 minus the endpoint's unexpired claims of its due deliveries, none behind an earlier one of its submission.
WITH ep AS (
    SELECT name FROM judgequeue.webhook_endpoints WHERE name = $1 FOR UPDATE
), busy AS (
    SELECT count(*) AS n FROM judgequeue.webhook_deliveries
     WHERE endpoint = $1 AND claimed_by IS NOT NULL AND claim_expires_at > now()
), picked AS (
    SELECT d.event_id
      FROM judgequeue.webhook_deliveries d, ep
     WHERE d.endpoint = $1 AND d.state = 'PENDING' AND d.next_attempt_at <= now()
       AND (d.claim_expires_at IS NULL OR d.claim_expires_at <= now())
       AND NOT EXISTS (
           SELECT 1 FROM judgequeue.webhook_deliveries p
            WHERE p.endpoint = $1 AND p.submission_id = d.submission_id AND p.state = 'PENDING'
              AND p.event_id < d.event_id)
     ORDER BY d.event_id
     LIMIT greatest($2 - (SELECT n FROM busy), 0)
)
UPDATE judgequeue.webhook_deliveries d
   SET claimed_by = $3, claim_expires_at = now() + make_interval(secs => $4::float8), attempts = d.attempts + 1
  FROM picked
 WHERE d.endpoint = $1 AND d.event_id = picked.event_id
RETURNING d.event_id, d.submission_id, d.generation, d.body::text AS body, d.attempts

-- name: webhook_delivered
-- Forget deliveries the endpoint accepted (fenced on the claim's owner); each one's seconds since its verdict's commit.
DELETE FROM judgequeue.webhook_deliveries
 WHERE endpoint = $1 AND event_id = ANY($2::bigint[]) AND claimed_by = $3
RETURNING extract(epoch FROM clock_timestamp() - (body ->> 'committed_at')::timestamptz)::float8 AS lag

-- name: webhook_failed
-- A delivery failed: due again after $5 seconds, or DEAD when permanent ($7) or at $4 attempts (fenced on the claim's owner).
UPDATE judgequeue.webhook_deliveries
   SET state = CASE WHEN $7::boolean OR attempts >= $4 THEN 'DEAD' ELSE 'PENDING' END,
       next_attempt_at = now() + make_interval(secs => $5::float8),
       last_error = left($6, 1000),
       claimed_by = NULL,
       claim_expires_at = NULL
 WHERE endpoint = $1 AND event_id = $2 AND claimed_by = $3
RETURNING state

-- name: webhook_release
-- Give back claims a stopping deliverer did not finish (not counted as an attempt).
UPDATE judgequeue.webhook_deliveries
   SET claimed_by = NULL, claim_expires_at = NULL, attempts = greatest(attempts - 1, 0)
 WHERE endpoint = $1 AND claimed_by = $2 AND state = 'PENDING'

-- name: webhook_dead
-- An endpoint's dead deliveries, oldest first.
SELECT event_id, submission_id, generation, attempts, last_error, created_at, body::text AS body
  FROM judgequeue.webhook_deliveries
 WHERE endpoint = $1 AND state = 'DEAD'
 ORDER BY event_id
 LIMIT $2

-- name: webhook_replay
-- Make an endpoint's dead deliveries ($2: these event ids; empty: all) due again with fresh attempts.
UPDATE judgequeue.webhook_deliveries
   SET state = 'PENDING', attempts = 0, next_attempt_at = now(), last_error = NULL
 WHERE endpoint = $1 AND state = 'DEAD' AND (cardinality($2::bigint[]) = 0 OR event_id = ANY($2::bigint[]))
RETURNING event_id

-- name: webhook_stats
-- An endpoint's deliveries: pending, dead, and the oldest pending one's age in seconds.
SELECT count(*) FILTER (WHERE state = 'PENDING') AS pending,
       count(*) FILTER (WHERE state = 'DEAD') AS dead,
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'PENDING')), 0)::float8 AS age
  FROM judgequeue.webhook_deliveries WHERE endpoint = $1

-- name: webhook_health
-- Each webhook endpoint of queue $1: deliveries waiting and dead, the oldest waiting one's age, the most attempts of one waiting, and the latest error.
SELECT w.name,
       count(d.event_id) FILTER (WHERE d.state = 'PENDING') AS pending,
       count(d.event_id) FILTER (WHERE d.state = 'DEAD') AS dead,
       coalesce(extract(epoch FROM now() - min(d.created_at) FILTER (WHERE d.state = 'PENDING')), 0)::float8 AS age,
       coalesce(max(d.attempts) FILTER (WHERE d.state = 'PENDING' AND d.last_error IS NOT NULL), 0) AS failing_attempts,
       (SELECT e.last_error FROM judgequeue.webhook_deliveries e
         WHERE e.endpoint = w.name AND e.last_error IS NOT NULL
         ORDER BY e.next_attempt_at DESC LIMIT 1) AS last_error
  FROM judgequeue.webhook_endpoints w
  LEFT JOIN judgequeue.webhook_deliveries d ON d.endpoint = w.name
 WHERE w.queue = $1
 GROUP BY w.name
 ORDER BY w.name

-- name: webhook_prune_dead
-- Delete a batch of a queue's dead webhook deliveries older than the retention.
WITH doomed AS (
    SELECT d.endpoint, d.event_id
      FROM judgequeue.webhook_deliveries d
      JOIN judgequeue.webhook_endpoints w ON w.name = d.endpoint
     WHERE w.queue = $3 AND d.state = 'DEAD' AND d.created_at < now() - make_interval(secs => $1)
     LIMIT $2
)
DELETE FROM judgequeue.webhook_deliveries d USING doomed
 WHERE d.endpoint = doomed.endpoint AND d.event_id = doomed.event_id

-- name: submission_cancel
-- Cancel a submission of queue $1 (judgequeue.cancel()): its generation and whether this call cancelled it.
SELECT generation, cancelled_now FROM judgequeue.cancel($1::text, $2::bigint, $3::text)

-- name: submission_history
-- A submission's verdicts of queue $1, oldest first, each with its generation and cause.
SELECT h.generation, h.status, h.cause, h.verdict, h.created_at
  FROM judgequeue.verdict_history h
 WHERE h.submission_id = $2 AND h.queue = $1
 ORDER BY h.id

-- name: submission_in_queue
-- True when submission $2 is one of queue $1's, else no row.
SELECT true FROM judgequeue.submissions WHERE id = $2 AND queue = $1

-- name: history_prune
-- Delete a batch of a queue's verdict history older than the retention, oldest first.
-- include: prune_by_age table=verdict_history alias=h

-- name: lease_gone
-- Which of these live leases are no longer held, each with whether its submission was cancelled (read only).
SELECT l.attempt AS attempt_id, coalesce(s.status = 'CANCELLED', false) AS cancelled
  FROM unnest($1::bigint[], $2::bigint[], $3::uuid[]) AS l(id, generation, attempt)
  LEFT JOIN judgequeue.submissions s ON s.id = l.id
 WHERE s.id IS NULL
    OR NOT (s.generation = l.generation AND s.attempt_id IS NOT DISTINCT FROM l.attempt AND s.status = 'JUDGING')

-- name: rejudging_preview
-- Open a rejudging of queue $1 in class $2 (NULL: the lowest) by ids, problem and creation time: its id, previewed and left out.
SELECT rejudging, previewed, left_out
  FROM judgequeue.rejudging_preview($1, $2, $3::bigint[], $4, $5::timestamptz, $6::timestamptz)

-- name: rejudging_apply
-- Apply rejudging $2 of queue $1 ($3: partially, while proposals are missing): applied, stale, missing, applied_now.
SELECT applied, stale, missing, applied_now FROM judgequeue.rejudging_apply($1::text, $2::bigint, $3::boolean)

-- name: rejudging_cancel
-- Discard rejudging $2 of queue $1: whether this call cancelled it and the probes it stopped.
SELECT cancelled_now, stopped FROM judgequeue.rejudging_cancel($1::text, $2::bigint)

-- name: rejudging_list
-- Queue $1's rejudgings (only rejudging $2 when given), newest first, each with its size and
-- proposals judged so far.
SELECT r.id, r.queue, r.job_class, r.state, r.selection, r.left_out, r.created_at, r.finished_at,
       r.applied, r.stale, r.missing,
       (SELECT count(*) FROM judgequeue.rejudging_items i WHERE i.rejudging = r.id) AS items,
       (SELECT count(*) FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe
         WHERE i.rejudging = r.id AND p.status = ANY (judgequeue.verdict_names())) AS judged
  FROM judgequeue.rejudgings r
 WHERE r.queue = $1 AND ($2::bigint IS NULL OR r.id = $2)
 ORDER BY r.id DESC

-- name: rejudging_items
-- Every submission rejudging $2 of queue $1 previews: old and proposed status and verdict, and whether it moved on since.
SELECT i.submission_id, i.base_generation, i.old_status, i.old_verdict, i.probe, i.outcome,
       CASE WHEN p.status = ANY (judgequeue.verdict_names()) THEN p.status END AS new_status,
       CASE WHEN p.status = ANY (judgequeue.verdict_names()) THEN p.verdict END AS new_verdict,
       s.generation AS current_generation
  FROM judgequeue.rejudging_items i
  JOIN judgequeue.rejudgings r ON r.id = i.rejudging
  LEFT JOIN judgequeue.submissions p ON p.id = i.probe
  LEFT JOIN judgequeue.submissions s ON s.id = i.submission_id
 WHERE i.rejudging = $2 AND r.queue = $1
 ORDER BY i.submission_id

-- name: rejudgings_prune
-- Delete a batch of a queue's rejudgings (and their items) opened before the retention, oldest first.
-- include: prune_by_age table=rejudgings alias=r
