-- judgequeue 0010: offers. An idle direct-intake worker offers some of its free slots; a submit
-- that finds one fills it in the submit's own transaction: the submission is written already
-- leased to that worker (JUDGING, a fresh attempt, a lease on the database clock) and its outbox
-- row already SENT, and the worker alone is notified with the job. No statement of the worker's
-- stands between the commit and the judge (docs/design.md §1, docs/performance.md).
--
-- Nothing else changes: the lease is a lease like any other (heartbeat, fence, expiry and rescue by
-- the reaper if the worker is gone), and a submit that finds no offer writes a PENDING row as before.
-- The lease runs from the submit statement, not from the commit: an application transaction that
-- stays open longer than the worker's lease TTL after submit() commits an expired lease, which the
-- reaper rescues like any other (a second run, fenced). Submits in REPEATABLE READ or SERIALIZABLE
-- transactions never fill offers (see the interlock below).

-- Soft state, like dispatch_waiters: lost in a crash by design (workers offer again; a job already
-- handed over keeps its lease). An offer not refreshed by expires_at is never filled (a dead worker
-- stops refreshing), and the reaper prunes old rows. Filling one sets submission/attempt (a HOT
-- update: no index changes); the worker deletes the row once it has the job.
CREATE UNLOGGED TABLE judgequeue.worker_offers (
    queue       text NOT NULL,
    worker      text NOT NULL,
    slot        integer NOT NULL,
    channel     text NOT NULL,                       -- the worker's own notification channel
    lease_ttl   float8 NOT NULL CHECK (lease_ttl > 0),
    expires_at  timestamptz NOT NULL,
    submission  bigint,                               -- set when a submit filled the offer
    attempt     uuid,
    PRIMARY KEY (queue, worker, slot)
);

-- The largest payload a notification carries with its job (NOTIFY takes under 8,000 bytes); a
-- larger one the worker reads from the table.
CREATE FUNCTION judgequeue.offer_payload_bytes() RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT 7000 $$;

-- A flag flip (mode, watermark, paused) and a submit filling an offer exclude each other: the
-- submit decides on the flags it read and its decision takes effect at its commit, which may come
-- long after (the application's transaction), so a flip must not commit in between (invariant 4:
-- no live dispatch of a pre-watermark row, none after a pause or a rollback to shadow). Submits
-- that fill offers hold this key shared until they commit; a flip takes it exclusively, so it waits
-- for them (set_cutover bounds that wait and says so), and a submit that cannot get it at once (a
-- flip is waiting or running) writes a PENDING row, which the flags judge later. The rule needs a
-- fresh snapshot per statement: only READ COMMITTED transactions fill offers (see submit()).
CREATE FUNCTION judgequeue.offers_lock_key(p_queue text) RETURNS bigint LANGUAGE sql IMMUTABLE
    AS $$ SELECT (hashtext('judgequeue.offers')::bigint << 32) | (hashtext(p_queue)::bigint & 4294967295) $$;

CREATE OR REPLACE FUNCTION judgequeue.queues_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.mode, NEW.watermark, NEW.paused) IS DISTINCT FROM (OLD.mode, OLD.watermark, OLD.paused) THEN
        -- Already held when the flip came through judgequeue (set_cutover takes it first, with a
        -- bounded wait, before it locks this row); taken here for any other writer of the flags.
        PERFORM pg_advisory_xact_lock(judgequeue.offers_lock_key(NEW.name));
    END IF;
    IF OLD.watermark IS NOT NULL
       AND (NEW.watermark IS NULL OR NEW.watermark < OLD.watermark) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'JQ005',
            MESSAGE = format('queue %s: watermark may only move forward (current %s, requested %s)',
                             OLD.name, OLD.watermark, coalesce(NEW.watermark::text, 'none'));
    END IF;
    IF (NEW.mode, NEW.watermark, NEW.paused) IS DISTINCT FROM (OLD.mode, OLD.watermark, OLD.paused) THEN
        NEW.config_version := OLD.config_version + 1;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END $$;

-- Enqueue a submission inside the caller's transaction: the submission row and its delivery
-- intent commit or roll back together. Errors use SQLSTATEs JQ001..JQ004 (see core/errors.py).
-- With an open offer on a live queue (and its rows at or past the watermark) the intent is
-- delivered here: the submission is leased to the offering worker and that worker is notified.
CREATE OR REPLACE FUNCTION judgequeue.submit(p_queue text, p_payload jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_text text;
    v_size integer;
    v_known boolean;
    v_live boolean;
    v_offer record;
    v_filled boolean := false;
BEGIN
    IF NOT judgequeue.is_dns_label(p_queue) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ001',
            MESSAGE = format('queue name %L is not a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters)', p_queue);
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ004', MESSAGE = 'payload must be a JSON value, got NULL';
    END IF;
    v_text := p_payload::text;
    v_size := octet_length(v_text);
    IF v_size > judgequeue.max_payload_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ003',
            MESSAGE = format('payload is %s bytes, over the limit of %s bytes', v_size, judgequeue.max_payload_bytes());
    END IF;

    -- Fill an open offer at once (locked for this transaction; other submits skip it), with the
    -- submission id taken ahead (it is this submission's id whichever way it goes). The lock below
    -- is taken only then, so a flip waits only for submits that fill offers. Only at READ
    -- COMMITTED: the flags must be read after that lock with a snapshot of their own, which a
    -- REPEATABLE READ or SERIALIZABLE transaction does not take (its snapshot may predate a flip),
    -- and such a transaction would also fail on offers changed since its snapshot (40001).
    v_id := nextval('judgequeue.submissions_id_seq'::regclass);
    IF current_setting('transaction_isolation') = 'read committed' THEN
        UPDATE judgequeue.worker_offers o SET submission = v_id, attempt = gen_random_uuid()
         WHERE o.ctid = (SELECT ctid FROM judgequeue.worker_offers
                          WHERE queue = p_queue AND submission IS NULL AND expires_at > clock_timestamp()
                          LIMIT 1
                            FOR UPDATE SKIP LOCKED)
        RETURNING o.ctid AS at_ctid, o.worker, o.slot, o.channel, o.lease_ttl, o.attempt INTO v_offer;
        v_filled := FOUND;
    END IF;
    IF v_filled THEN
        IF pg_try_advisory_xact_lock_shared(judgequeue.offers_lock_key(p_queue)) THEN
            -- Read after the lock: a flip committed before it is seen, one after it waits for this commit.
            SELECT true, mode = 'live' AND NOT paused AND (watermark IS NULL OR watermark <= now())
              INTO v_known, v_live
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
            PERFORM pg_notify(v_offer.channel, concat_ws(' ', v_id, v_offer.attempt, v_offer.slot,
                extract(epoch FROM now()),
                CASE WHEN v_size <= judgequeue.offer_payload_bytes() THEN v_text END));
            RETURN v_id;
        END IF;
        -- Not handed over (a flip is under way; paused, shadow, before the watermark): open again.
        UPDATE judgequeue.worker_offers SET submission = NULL, attempt = NULL WHERE ctid = v_offer.at_ctid;
    END IF;
    IF v_known IS NULL THEN
        SELECT true INTO v_known FROM judgequeue.queues WHERE name = p_queue;
    END IF;
    IF v_known IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ002',
            MESSAGE = format('unknown queue %L (create it with: judgequeue queue create %s)', p_queue, p_queue);
    END IF;

    INSERT INTO judgequeue.submissions (id, queue, payload) OVERRIDING SYSTEM VALUE VALUES (v_id, p_queue, p_payload);
    INSERT INTO judgequeue.outbox (queue, submission_id, generation) VALUES (p_queue, v_id, 1);

    PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify('judgequeue_wakeup', p_queue);
    END IF;
    RETURN v_id;
END $$;
