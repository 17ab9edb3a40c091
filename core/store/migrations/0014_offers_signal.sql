-- judgequeue 0014: a mode that is off costs nothing. Since 0010 every submit looked for a worker's
-- offer to fill (an id drawn ahead, the isolation level read, an UPDATE of worker_offers), also in
-- the queues where no worker ever offers (every queue of the stream intake): about 30% more work
-- per submit than before offers. Now the queue row says until when an offer may be open there
-- (queues.offers_until, written by the workers' offers sync, core/sql/queries.sql offers_sync),
-- submit() reads it with the queue check it already made, and a queue without offers gets the
-- statements of a submit from before 0010: the queue check, the two INSERTs, the waiters check.
--
-- The signal cannot say "no offers" while an offer is fillable, short of a sync that found the
-- queue row locked; such an offer is harmless, only not filled (see submit()). Not a flag: the
-- trigger changes neither config_version nor updated_at for it, and a flip does not wait on it.
ALTER TABLE judgequeue.queues ADD COLUMN offers_until timestamptz;

-- Offers open at the upgrade stay fillable until they expire (workers of the previous version do
-- not write the signal: from then on their offers are only not filled).
UPDATE judgequeue.queues q
   SET offers_until = o.until
  FROM (SELECT queue, max(expires_at) AS until FROM judgequeue.worker_offers GROUP BY queue) o
 WHERE o.queue = q.name;

-- As in 0010, plus: offers are looked for only while the queue's offers_until is in the future; an
-- id is drawn ahead only for an offer filled.
CREATE OR REPLACE FUNCTION judgequeue.submit(p_queue text, p_payload jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_offers boolean;
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
    -- The queue check reads whether an offer may be open: the sync that opens or refreshes a
    -- worker's offers moves offers_until at or past their expiry in the same statement (offers_sync
    -- in core/sql/queries.sql), so once it is past no offer of this queue is fillable. An offer the
    -- signal missed (that write skips a queue row locked by someone else) is harmless, only not
    -- filled: this submit writes a PENDING row and wakes the registered waiters as below, the
    -- offering worker among them (a worker offers while it waits, registered), which then takes
    -- its offers back and the row in (as for a rejudge or a rescue); a worker not woken looks
    -- within its schedule, and the dispatcher streams what no worker took.
    SELECT offers_until > clock_timestamp() INTO v_offers FROM judgequeue.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ002',
            MESSAGE = format('unknown queue %L (create it with: judgequeue queue create %s)', p_queue, p_queue);
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
                    INSERT INTO judgequeue.submissions (id, queue, payload, status, attempt_id, lease_expires_at)
                        OVERRIDING SYSTEM VALUE
                        VALUES (v_id, p_queue, p_payload, 'JUDGING', v_offer.attempt,
                                clock_timestamp() + make_interval(secs => v_offer.lease_ttl));
                    INSERT INTO judgequeue.outbox (queue, submission_id, generation, state, attempts, claimed_by, sent_at)
                        VALUES (p_queue, v_id, 1, 'SENT', 1, v_offer.worker, now());
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
    INSERT INTO judgequeue.submissions (queue, payload) VALUES (p_queue, p_payload) RETURNING id INTO v_id;
    INSERT INTO judgequeue.outbox (queue, submission_id, generation) VALUES (p_queue, v_id, 1);

    PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify('judgequeue_wakeup', p_queue);
    END IF;
    RETURN v_id;
END $$;
