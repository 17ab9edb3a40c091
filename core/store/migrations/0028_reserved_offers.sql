-- Reserved slots for a queue's first class (docs/design.md, "Priority classes and fair share"): a
-- direct-intake worker of a queue with several classes keeps a few of its slots out of its takes and
-- offers them to first-class submits only (worker_offers.max_rank 0). submit() fills such an offer
-- only with a first-class job that no ready job of its class is ahead of; every other offer
-- (max_rank NULL, as every offer before this migration) is filled as before.

ALTER TABLE judgequeue.worker_offers ADD COLUMN max_rank smallint;

CREATE OR REPLACE FUNCTION judgequeue.submit(p_queue text, p_payload jsonb, p_class text DEFAULT NULL, p_key text DEFAULT NULL)
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
    v_ahead boolean := false;
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
            -- A reserved offer (max_rank 0: a worker keeps a few slots for the first class of a queue
            -- with several) takes a first-class job only if no ready job of the class is ahead of it
            -- (a job without a key: one without a key is waiting; with a key: one of a lower turn), so
            -- it starts a job the next take would start first anyway, without waiting for that take.
            -- One probe of outbox_claim, only for first-class submits in a queue with several classes.
            IF v_rank = 0 AND cardinality(v_classes) > 1 THEN
                v_ahead := EXISTS (SELECT 1 FROM judgequeue.outbox o
                                    WHERE o.queue = p_queue AND o.class_rank = 0 AND o.state IN ('PENDING', 'CLAIMED')
                                      AND o.fair_seq <= CASE WHEN p_key IS NULL THEN 0 ELSE v_seq - 1 END
                                      AND o.next_attempt_at <= now());
            END IF;
            UPDATE judgequeue.worker_offers o
               SET submission = nextval('judgequeue.submissions_id_seq'::regclass), attempt = gen_random_uuid()
             WHERE o.ctid = (SELECT ctid FROM judgequeue.worker_offers
                              WHERE queue = p_queue AND submission IS NULL AND expires_at > clock_timestamp()
                                AND (max_rank IS NULL OR (v_rank <= max_rank AND NOT v_ahead))
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
