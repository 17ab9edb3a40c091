-- judgequeue 0001: queues (cutover flags), submissions (the fence target) and the outbox.
-- All decisions use the database clock; nothing here trusts a client's time.

CREATE TABLE judgequeue.queues (
    name            text PRIMARY KEY
                    CHECK (length(name) <= 63 AND name ~ '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'),
    mode            text NOT NULL DEFAULT 'live' CHECK (mode IN ('live', 'shadow')),
    watermark       timestamptz,
    paused          boolean NOT NULL DEFAULT false,
    config_version  bigint NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The watermark only moves forward (clearing it would move it back to the beginning of time);
-- every real change bumps config_version so readers can tell which flags they acted on.
CREATE FUNCTION judgequeue.queues_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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

CREATE TRIGGER queues_guard BEFORE UPDATE ON judgequeue.queues
    FOR EACH ROW EXECUTE FUNCTION judgequeue.queues_guard();

-- No foreign key to queues on purpose: every submit would take a KEY SHARE lock on the same queue
-- row, and many concurrent lockers of one row turn into MultiXacts that cap commit throughput.
-- judgequeue.submit() checks the queue instead.
CREATE TABLE judgequeue.submissions (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL,
    payload           jsonb NOT NULL,
    status            text NOT NULL DEFAULT 'PENDING' CHECK (status IN (
                          'PENDING', 'JUDGING', 'ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT',
                          'MEMORY_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR', 'SYSTEM_ERROR')),
    generation        bigint NOT NULL DEFAULT 1,
    attempt_id        uuid,
    lease_expires_at  timestamptz,
    retry_count       integer NOT NULL DEFAULT 0,
    verdict           jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz
);

-- Serves the lease reaper: only JUDGING rows carry a lease.
CREATE INDEX submissions_lease ON judgequeue.submissions (lease_expires_at) WHERE status = 'JUDGING';

CREATE TABLE judgequeue.outbox (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL,
    submission_id     bigint NOT NULL,
    generation        bigint NOT NULL,
    state             text NOT NULL DEFAULT 'PENDING' CHECK (state IN (
                          'PENDING', 'CLAIMED', 'SENT', 'DEAD', 'SKIPPED', 'SHADOW_SENT')),
    attempts          integer NOT NULL DEFAULT 0,
    last_error        text,
    -- For PENDING rows: when the row may be tried (backoff). For CLAIMED rows: when the claim
    -- expires. One column lets one partial index serve both "ready" and "abandoned" rows.
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    claimed_by        text,
    claim_expires_at  timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    sent_at           timestamptz,
    UNIQUE (submission_id, generation)
);

CREATE INDEX outbox_claim ON judgequeue.outbox (queue, next_attempt_at, id)
    WHERE state IN ('PENDING', 'CLAIMED');

-- Idle dispatchers register here before they block on LISTEN; submit() notifies only while a
-- waiter exists, so a busy system pays nothing for the wake-up (a NOTIFY per commit serialises
-- commits on the notification queue lock). UNLOGGED: it is soft state, lost on crash by design.
CREATE UNLOGGED TABLE judgequeue.dispatch_waiters (
    queue       text NOT NULL,
    dispatcher  text NOT NULL,
    since       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, dispatcher)
);

-- Limits kept in one place so SQL and Python agree; submit() reads them.
CREATE FUNCTION judgequeue.max_payload_bytes() RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT 1048576 $$;

CREATE FUNCTION judgequeue.is_dns_label(p_name text) RETURNS boolean LANGUAGE sql IMMUTABLE
    AS $$ SELECT p_name IS NOT NULL AND length(p_name) <= 63
                 AND p_name ~ '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$' $$;

-- Enqueue a submission inside the caller's transaction: the submission row and its delivery
-- intent commit or roll back together. Errors use SQLSTATEs JQ001..JQ004 (see core/errors.py).
CREATE FUNCTION judgequeue.submit(p_queue text, p_payload jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
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
    PERFORM 1 FROM judgequeue.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ002',
            MESSAGE = format('unknown queue %L (create it with: judgequeue queue create %s)', p_queue, p_queue);
    END IF;

    INSERT INTO judgequeue.submissions (queue, payload) VALUES (p_queue, p_payload)
        RETURNING id INTO v_id;
    INSERT INTO judgequeue.outbox (queue, submission_id, generation) VALUES (p_queue, v_id, 1);

    PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify('judgequeue_wakeup', p_queue);
    END IF;
    RETURN v_id;
END $$;

-- Start a new generation of a submission and write its delivery intent, atomically. Any verdict
-- of an older generation is fenced out from then on. p_expected_generation (when given) makes the
-- bump conditional, so two actors racing to rescue the same attempt bump it once.
-- p_count_retry: a lease expiry or release counts towards maxRetries; a user's rejudge resets it.
-- Returns the new generation, or NULL when nothing was bumped.
CREATE FUNCTION judgequeue.bump_generation(
    p_submission_id bigint, p_expected_generation bigint, p_count_retry boolean
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_generation bigint;
BEGIN
    UPDATE judgequeue.submissions
       SET generation = generation + 1,
           status = 'PENDING',
           attempt_id = NULL,
           lease_expires_at = NULL,
           verdict = NULL,
           finished_at = NULL,
           retry_count = CASE WHEN p_count_retry THEN retry_count + 1 ELSE 0 END
     WHERE id = p_submission_id
       AND (p_expected_generation IS NULL OR generation = p_expected_generation)
    RETURNING queue, generation INTO v_queue, v_generation;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO judgequeue.outbox (queue, submission_id, generation)
        VALUES (v_queue, p_submission_id, v_generation);
    PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = v_queue LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify('judgequeue_wakeup', v_queue);
    END IF;
    RETURN v_generation;
END $$;

CREATE FUNCTION judgequeue.rejudge(p_submission_id bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_generation bigint;
BEGIN
    v_generation := judgequeue.bump_generation(p_submission_id, NULL, false);
    IF v_generation IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006',
            MESSAGE = format('unknown submission %s', p_submission_id);
    END IF;
    RETURN v_generation;
END $$;
