-- judgequeue 0018: priority classes per queue and fair share by key within a class.
--
-- A queue declares its classes, highest first (queues.classes, default one class, 'default'), each
-- with a share of the claims in which it goes first (class_shares: whole percent, the first class's
-- 0). A submission keeps its class and fairness key (submissions.job_class, fair_key: NULL is the
-- first class, no key), and each delivery carries its class's rank and its key's turn
-- (outbox.class_rank, fair_key, fair_seq). The claim index leads with (class_rank, fair_seq), so a
-- claim visits the classes in rank order and, within one, the keys in turn; rows without a key
-- (fair_seq 0) keep the order they had (readiness, then id). Adding the columns rewrites nothing
-- (constant defaults); every existing row is the first class, no key, as before. The claim index is
-- rebuilt (it locks out outbox writes while it builds: seconds per million waiting rows, since only
-- PENDING and CLAIMED rows enter it).
ALTER TABLE judgequeue.queues
    ADD COLUMN classes text[] NOT NULL DEFAULT ARRAY['default']::text[],
    ADD COLUMN class_shares smallint[] NOT NULL DEFAULT ARRAY[0]::smallint[];
ALTER TABLE judgequeue.submissions ADD COLUMN job_class text, ADD COLUMN fair_key text;
ALTER TABLE judgequeue.outbox
    ADD COLUMN class_rank smallint NOT NULL DEFAULT 0,
    ADD COLUMN fair_key text,
    ADD COLUMN fair_seq bigint NOT NULL DEFAULT 0;

DROP INDEX judgequeue.outbox_claim;
CREATE INDEX outbox_claim ON judgequeue.outbox (queue, class_rank, fair_seq, next_attempt_at, id)
    WHERE state IN ('PENDING', 'CLAIMED');
CREATE INDEX outbox_fair_key ON judgequeue.outbox (queue, class_rank, fair_key, fair_seq)
    WHERE state IN ('PENDING', 'CLAIMED') AND fair_key IS NOT NULL;

-- submit() and rejudge() take a class (and submit() a key), with defaults: a caller of the old
-- signatures (an application of the previous version) reaches the new functions unchanged.
DROP FUNCTION judgequeue.submit(text, jsonb);
DROP FUNCTION judgequeue.rejudge(bigint);

-- A queue's classes are valid: 1 to 16 distinct DNS labels, highest first, each with a share (whole
-- percent, 0-100, the first class's always 0) summing to at most 100.
CREATE FUNCTION judgequeue.valid_classes(p_names text[], p_shares smallint[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT cardinality(p_names) BETWEEN 1 AND 16
       AND cardinality(p_shares) = cardinality(p_names)
       AND p_shares[1] = 0
       AND (SELECT bool_and(judgequeue.is_dns_label(n)) AND count(DISTINCT n) = cardinality(p_names)
              FROM unnest(p_names) AS n)
       AND (SELECT bool_and(s BETWEEN 0 AND 100) AND sum(s) <= 100 FROM unnest(p_shares) AS s)
$$;

-- The rank of a class in a queue (0 = the first, highest): NULL is the first class; a name no
-- longer declared (a spec that dropped it after the job was queued) is the lowest.
CREATE FUNCTION judgequeue.class_rank(p_classes text[], p_class text) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (CASE WHEN p_class IS NULL THEN 0
                 ELSE coalesce(array_position(p_classes, p_class), cardinality(p_classes)) - 1 END)::smallint
$$;

-- The order in which one claim visits a queue's classes: by rank, except that with probability
-- share/100 a class with a share is visited first (it goes first in that share of the claims while
-- it has ready rows: the starvation bound of the classes below the first). PL/pgSQL: no planning per call.
CREATE FUNCTION judgequeue.claim_order(p_shares smallint[]) RETURNS smallint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_x float8;
    v_upto integer := 0;
    v_first integer;
    v_out smallint[] := '{}';
BEGIN
    IF cardinality(p_shares) = 1 THEN
        RETURN ARRAY[0]::smallint[];
    END IF;
    v_x := random() * 100;
    FOR i IN 1 .. cardinality(p_shares) LOOP
        IF v_first IS NULL AND v_x >= v_upto AND v_x < v_upto + p_shares[i] THEN
            v_first := i;
        END IF;
        v_upto := v_upto + p_shares[i];
    END LOOP;
    IF v_first IS NOT NULL THEN
        v_out := ARRAY[(v_first - 1)::smallint];
    END IF;
    FOR i IN 1 .. cardinality(p_shares) LOOP
        IF i IS DISTINCT FROM v_first THEN
            v_out := v_out || (i - 1)::smallint;
        END IF;
    END LOOP;
    RETURN v_out;
END $$;

-- Fair share within a class: a job with a fairness key is ordered by a sequence number, one more than
-- the key's last waiting job, and never below the class's head (the lowest number still waiting),
-- so a key that had nothing waiting starts at the head beside a bursting key's next job, and keys
-- with waiting jobs take turns (start-time fair queuing). Jobs without a key are 0: first in their
-- class, in order of readiness, as in a queue with no keys. Two index probes (PL/pgSQL: their plans
-- are kept per session, where a SQL function's would be planned at every call).
CREATE FUNCTION judgequeue.fair_seq(p_queue text, p_rank smallint, p_key text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_last bigint;
    v_head bigint;
BEGIN
    IF p_key IS NULL THEN
        RETURN 0;
    END IF;
    SELECT max(o.fair_seq) INTO v_last FROM judgequeue.outbox o
     WHERE o.queue = p_queue AND o.class_rank = p_rank AND o.fair_key = p_key
       AND o.state IN ('PENDING', 'CLAIMED');
    SELECT o.fair_seq - 1 INTO v_head FROM judgequeue.outbox o
     WHERE o.queue = p_queue AND o.class_rank = p_rank AND o.state IN ('PENDING', 'CLAIMED') AND o.fair_seq > 0
     ORDER BY o.fair_seq LIMIT 1;
    RETURN greatest(v_last, v_head, 0) + 1;
END $$;

-- Enqueue a submission inside the caller's transaction: the submission row and its delivery intent
-- commit or roll back together. With an open offer on a live queue (and its rows at or past the
-- watermark) the intent is delivered here: the submission is written already leased to the offering
-- worker (JUDGING, a fresh attempt, the lease on the database clock), its outbox row already SENT,
-- and that worker alone is notified with the job. The lease runs from the submit statement, not
-- from the commit: an application transaction that stays open longer than the lease TTL commits an
-- expired lease, which the reaper rescues like any other (a second run, fenced).
--
-- p_class: one of the queue's classes (NULL: the first, highest); p_key: the fairness key within the
-- class (a contest id; NULL: none). A class the queue does not declare is refused (JQ009) naming them.
--
-- A mode that is off costs nothing: in a queue where no offer can be open (queues.offers_until
-- NULL or past, as in every queue of the stream intake) a submit runs the statements it ran before
-- offers existed (the queue check, the two INSERTs, the waiters check), no more; a fairness key adds
-- the two probes of fair_seq().
CREATE FUNCTION judgequeue.submit(p_queue text, p_payload jsonb, p_class text DEFAULT NULL, p_key text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_offers boolean;
    v_classes text[];
    v_rank smallint;
    v_seq bigint := 0;
    v_live boolean;
    v_offer record;
    v_text text;
BEGIN
    IF NOT judgequeue.is_dns_label(p_queue) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ001',
            MESSAGE = format('queue name %L is not a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters)', p_queue);
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ004', MESSAGE = 'payload must be a JSON value, got NULL';
    END IF;
    IF octet_length(p_payload::text) > judgequeue.max_payload_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ003',
            MESSAGE = format('payload is %s bytes, over the limit of %s bytes',
                             octet_length(p_payload::text), judgequeue.max_payload_bytes());
    END IF;
    IF p_key IS NOT NULL AND (length(p_key) NOT BETWEEN 1 AND 200) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('fairness key must be 1 to 200 characters, got %s', length(p_key));
    END IF;
    -- The queue check reads whether an offer may be open: the sync that opens or refreshes a
    -- worker's offers moves offers_until at or past their expiry in the same statement (offers_sync
    -- in core/sql/queries.sql), so once it is past no offer of this queue is fillable. An offer the
    -- signal missed (that write skips a queue row locked by someone else) is harmless, only not
    -- filled: this submit writes a PENDING row and wakes the registered waiters as below, the
    -- offering worker among them (a worker offers while it waits, registered), which then takes
    -- its offers back and the row in (as for a rejudge or a rescue); a worker not woken looks
    -- within its schedule, and the dispatcher streams what no worker took.
    SELECT offers_until > clock_timestamp(), classes INTO v_offers, v_classes FROM judgequeue.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ002',
            MESSAGE = format('unknown queue %L (create it with: judgequeue queue create %s)', p_queue, p_queue);
    END IF;
    IF p_class IS NOT NULL AND NOT (p_class = ANY (v_classes)) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('class %L is not a class of queue %L (one of %s)', p_class, p_queue,
                             array_to_string(v_classes, ', '));
    END IF;
    v_rank := judgequeue.class_rank(v_classes, p_class);
    IF p_key IS NOT NULL THEN
        v_seq := judgequeue.fair_seq(p_queue, v_rank, p_key);
    END IF;

    -- Fill an open offer at once (locked for this transaction; other submits skip it); the
    -- submission id is drawn only for an offer filled. The lock below is taken only then, so a
    -- flip waits only for submits that fill offers. Only at READ COMMITTED: the flags must be read
    -- after that lock with a snapshot of their own, which a REPEATABLE READ or SERIALIZABLE
    -- transaction does not take (its snapshot may predate a flip), and such a transaction would
    -- also fail on offers changed since its snapshot (40001).
    IF v_offers THEN
        IF current_setting('transaction_isolation') = 'read committed' THEN
            UPDATE judgequeue.worker_offers o
               SET submission = nextval('judgequeue.submissions_id_seq'::regclass), attempt = gen_random_uuid()
             WHERE o.ctid = (SELECT ctid FROM judgequeue.worker_offers
                              WHERE queue = p_queue AND submission IS NULL AND expires_at > clock_timestamp()
                              LIMIT 1
                                FOR UPDATE SKIP LOCKED)
            RETURNING o.ctid AS at_ctid, o.submission, o.worker, o.slot, o.channel, o.lease_ttl, o.attempt
                 INTO v_offer;
            IF FOUND THEN
                v_id := v_offer.submission;
                IF pg_try_advisory_xact_lock_shared(judgequeue.offers_lock_key(p_queue)) THEN
                    -- Read after the lock: a flip committed before it is seen, one after it waits for this commit.
                    SELECT mode = 'live' AND NOT paused AND (watermark IS NULL OR watermark <= now())
                      INTO v_live
                      FROM judgequeue.queues WHERE name = p_queue;
                END IF;
                IF v_live THEN
                    INSERT INTO judgequeue.submissions (id, queue, payload, status, attempt_id, lease_expires_at,
                                                        job_class, fair_key)
                        OVERRIDING SYSTEM VALUE
                        VALUES (v_id, p_queue, p_payload, 'JUDGING', v_offer.attempt,
                                clock_timestamp() + make_interval(secs => v_offer.lease_ttl), p_class, p_key);
                    INSERT INTO judgequeue.outbox (queue, submission_id, generation, state, attempts, claimed_by, sent_at,
                                                   class_rank, fair_key)
                        VALUES (p_queue, v_id, 1, 'SENT', 1, v_offer.worker, now(), v_rank, p_key);
                    -- "<submission> <attempt> <slot> <created, epoch seconds>[ <payload>]"
                    v_text := p_payload::text;
                    PERFORM pg_notify(v_offer.channel, concat_ws(' ', v_id, v_offer.attempt, v_offer.slot,
                        extract(epoch FROM now()),
                        CASE WHEN octet_length(v_text) <= judgequeue.offer_payload_bytes() THEN v_text END));
                    RETURN v_id;
                END IF;
                -- Not handed over (a flip is under way; paused, shadow, before the watermark): open again.
                UPDATE judgequeue.worker_offers SET submission = NULL, attempt = NULL WHERE ctid = v_offer.at_ctid;
            END IF;
        END IF;
    END IF;

    -- (An id drawn for an offer given back above stays unused: a gap, as a rollback leaves.)
    INSERT INTO judgequeue.submissions (queue, payload, job_class, fair_key)
        VALUES (p_queue, p_payload, p_class, p_key) RETURNING id INTO v_id;
    INSERT INTO judgequeue.outbox (queue, submission_id, generation, class_rank, fair_key, fair_seq)
        VALUES (p_queue, v_id, 1, v_rank, p_key, v_seq);

    PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify('judgequeue_wakeup', p_queue);
    END IF;
    RETURN v_id;
END $$;

-- Start a new generation of a submission and write its delivery intent, atomically. Any verdict
-- of an older generation is fenced out from then on. p_expected_generation (when given) makes the
-- bump conditional, so two actors racing to rescue the same attempt bump it once.
-- p_count_retry: a lease expiry or release counts towards maxRetries and keeps the request; a
-- user's rejudge resets the count and starts a new request (request_generation, call_failures).
-- The new delivery keeps the submission's class and fairness key (a rescued contest job stays a
-- contest job). Returns the new generation, or NULL when nothing was bumped.
CREATE OR REPLACE FUNCTION judgequeue.bump_generation(
    p_submission_id bigint, p_expected_generation bigint, p_count_retry boolean
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_generation bigint;
    v_class text;
    v_key text;
    v_rank smallint;
BEGIN
    UPDATE judgequeue.submissions
       SET generation = generation + 1,
           status = 'PENDING',
           attempt_id = NULL,
           lease_expires_at = NULL,
           verdict = NULL,
           finished_at = NULL,
           retry_count = CASE WHEN p_count_retry THEN retry_count + 1 ELSE 0 END,
           request_generation = CASE WHEN p_count_retry THEN request_generation ELSE generation + 1 END,
           call_failures = CASE WHEN p_count_retry THEN call_failures ELSE 0 END
     WHERE id = p_submission_id
       AND (p_expected_generation IS NULL OR generation = p_expected_generation)
    RETURNING queue, generation, job_class, fair_key INTO v_queue, v_generation, v_class, v_key;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT judgequeue.class_rank(classes, v_class) INTO v_rank FROM judgequeue.queues WHERE name = v_queue;
    v_rank := coalesce(v_rank, 0);
    INSERT INTO judgequeue.outbox (queue, submission_id, generation, class_rank, fair_key, fair_seq)
        VALUES (v_queue, p_submission_id, v_generation, v_rank, v_key, judgequeue.fair_seq(v_queue, v_rank, v_key));
    PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = v_queue LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify('judgequeue_wakeup', v_queue);
    END IF;
    RETURN v_generation;
END $$;

-- A user's rejudge of one submission, in the class p_class (NULL: the queue's lowest). The
-- submission's class becomes p_class: a rescue of the rejudged job keeps it.
CREATE FUNCTION judgequeue.rejudge(p_submission_id bigint, p_class text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_generation bigint;
    v_queue text;
    v_classes text[];
BEGIN
    SELECT s.queue, q.classes INTO v_queue, v_classes
      FROM judgequeue.submissions s LEFT JOIN judgequeue.queues q ON q.name = s.queue
     WHERE s.id = p_submission_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006',
            MESSAGE = format('unknown submission %s', p_submission_id);
    END IF;
    v_classes := coalesce(v_classes, ARRAY['default']);
    IF p_class IS NOT NULL AND NOT (p_class = ANY (v_classes)) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('class %L is not a class of queue %L (one of %s)', p_class, v_queue,
                             array_to_string(v_classes, ', '));
    END IF;
    UPDATE judgequeue.submissions
       SET job_class = coalesce(p_class, v_classes[cardinality(v_classes)])
     WHERE id = p_submission_id;
    v_generation := judgequeue.bump_generation(p_submission_id, NULL, false);
    IF v_generation IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006',
            MESSAGE = format('unknown submission %s', p_submission_id);
    END IF;
    RETURN v_generation;
END $$;

-- A bulk rejudge of a queue's submissions in one statement: those in p_ids (NULL: any), of problem
-- p_problem (the payload's "problem"; NULL: any), created in [p_since, p_until) (NULL: unbounded),
-- at least one filter given; all in class p_class (NULL: the queue's lowest). Each gets a new
-- generation and delivery, as rejudge() gives one; keyed ones are numbered in turn per key.
-- Returns each rejudged submission with its new generation.
CREATE FUNCTION judgequeue.rejudge_many(
    p_queue text, p_class text, p_ids bigint[], p_problem text, p_since timestamptz, p_until timestamptz
) RETURNS TABLE (submission_id bigint, generation bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_classes text[];
    v_class text;
    v_rank smallint;
BEGIN
    SELECT classes INTO v_classes FROM judgequeue.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ002',
            MESSAGE = format('unknown queue %L (create it with: judgequeue queue create %s)', p_queue, p_queue);
    END IF;
    IF p_class IS NOT NULL AND NOT (p_class = ANY (v_classes)) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('class %L is not a class of queue %L (one of %s)', p_class, p_queue,
                             array_to_string(v_classes, ', '));
    END IF;
    IF p_ids IS NULL AND p_problem IS NULL AND p_since IS NULL AND p_until IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = 'a bulk rejudge needs at least one of: ids, problem, since, until';
    END IF;
    v_class := coalesce(p_class, v_classes[cardinality(v_classes)]);
    v_rank := judgequeue.class_rank(v_classes, v_class);
    RETURN QUERY
    WITH bumped AS (
        UPDATE judgequeue.submissions s
           SET generation = s.generation + 1,
               status = 'PENDING',
               attempt_id = NULL,
               lease_expires_at = NULL,
               verdict = NULL,
               finished_at = NULL,
               retry_count = 0,
               request_generation = s.generation + 1,
               call_failures = 0,
               job_class = v_class
         WHERE s.queue = p_queue
           AND (p_ids IS NULL OR s.id = ANY (p_ids))
           AND (p_problem IS NULL OR s.payload ->> 'problem' = p_problem)
           AND (p_since IS NULL OR s.created_at >= p_since)
           AND (p_until IS NULL OR s.created_at < p_until)
        RETURNING s.id, s.generation, s.fair_key
    ), numbered AS (
        SELECT b.id, b.generation, b.fair_key,
               CASE WHEN b.fair_key IS NULL THEN 0
                    ELSE judgequeue.fair_seq(p_queue, v_rank, b.fair_key)
                         + row_number() OVER (PARTITION BY b.fair_key ORDER BY b.id) - 1 END AS seq
          FROM bumped b
    ), queued AS (
        INSERT INTO judgequeue.outbox (queue, submission_id, generation, class_rank, fair_key, fair_seq)
        SELECT p_queue, n.id, n.generation, v_rank, n.fair_key, n.seq FROM numbered n ORDER BY n.id
        RETURNING outbox.submission_id, outbox.generation
    ), woken AS (
        SELECT pg_notify('judgequeue_wakeup', p_queue)
         WHERE EXISTS (SELECT 1 FROM queued)
           AND EXISTS (SELECT 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue)
    )
    SELECT q.submission_id, q.generation FROM queued q LEFT JOIN woken ON true ORDER BY q.submission_id;
END $$;

-- Give a lease back to be tried again no sooner than p_delay seconds from now (database clock):
-- fenced like a verdict on (id, generation, attempt, JUDGING); a new generation (older deliveries
-- are stale from then on) whose outbox row waits until then, with the reason as its last_error,
-- in the submission's class and with its fairness key.
-- p_failed: the try failed (counts in call_failures) rather than waited for a free slot. Unlike a
-- release it does not count towards maxRetries (lease expiries): the judge bounds its own tries.
-- Returns the new generation, or NULL when the lease was no longer held (the caller's try is stale).
CREATE OR REPLACE FUNCTION judgequeue.defer_lease(
    p_id bigint, p_generation bigint, p_attempt uuid, p_delay float8, p_failed boolean, p_reason text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_generation bigint;
    v_class text;
    v_key text;
    v_rank smallint;
BEGIN
    UPDATE judgequeue.submissions
       SET generation = generation + 1,
           status = 'PENDING',
           attempt_id = NULL,
           lease_expires_at = NULL,
           call_failures = call_failures + CASE WHEN p_failed THEN 1 ELSE 0 END
     WHERE id = p_id AND generation = p_generation AND attempt_id = p_attempt AND status = 'JUDGING'
    RETURNING queue, generation, job_class, fair_key INTO v_queue, v_generation, v_class, v_key;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT judgequeue.class_rank(classes, v_class) INTO v_rank FROM judgequeue.queues WHERE name = v_queue;
    v_rank := coalesce(v_rank, 0);
    INSERT INTO judgequeue.outbox (queue, submission_id, generation, next_attempt_at, last_error,
                                   class_rank, fair_key, fair_seq)
        VALUES (v_queue, p_id, v_generation, now() + make_interval(secs => greatest(p_delay, 0)),
                left(p_reason, 1000), v_rank, v_key, judgequeue.fair_seq(v_queue, v_rank, v_key));
    RETURN v_generation;
END $$;

ALTER TABLE judgequeue.queues ADD CONSTRAINT queues_classes_valid
    CHECK (judgequeue.valid_classes(classes, class_shares));
