-- judgequeue 0013: jobs that ask to be tried again later (a remote call answered 429/503, timed out
-- or hit its endpoint's concurrency bound) without holding a worker slot while they wait.
--
-- request_generation: the generation a submit or a rejudge created. Rescues of expired leases,
-- releases and deferrals bump the generation (the fence) but keep it, so a remote call's
-- idempotency key (queue, submission, request_generation) is the same for every try of one
-- request, and a rejudge (a new request) gets a new one.
-- call_failures: failed tries of this request (timeouts, connection errors, 5xx, 429), the retry
-- bound and backoff of the remote-call judge. Waiting for a free endpoint slot does not count.
ALTER TABLE judgequeue.submissions
    ADD COLUMN request_generation bigint NOT NULL DEFAULT 1,
    ADD COLUMN call_failures integer NOT NULL DEFAULT 0;

-- Submissions still in flight keep the request they belong to (generation - retry_count: a rejudge
-- resets retry_count, a rescue or release adds one to both).
UPDATE judgequeue.submissions SET request_generation = greatest(1, generation - retry_count)
 WHERE status IN ('PENDING', 'JUDGING') AND generation > 1;

-- As in 0001, plus: a rejudge (p_count_retry false) starts a new request.
CREATE OR REPLACE FUNCTION judgequeue.bump_generation(
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
           retry_count = CASE WHEN p_count_retry THEN retry_count + 1 ELSE 0 END,
           request_generation = CASE WHEN p_count_retry THEN request_generation ELSE generation + 1 END,
           call_failures = CASE WHEN p_count_retry THEN call_failures ELSE 0 END
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

-- Give a lease back to be tried again no sooner than p_delay seconds from now (database clock):
-- fenced like a verdict on (id, generation, attempt, JUDGING); a new generation (older deliveries
-- are stale from then on) whose outbox row waits until then, with the reason as its last_error.
-- p_failed: the try failed (counts in call_failures) rather than waited for a free slot. Unlike a
-- release it does not count towards maxRetries (lease expiries): the judge bounds its own tries.
-- Returns the new generation, or NULL when the lease was no longer held (the caller's try is stale).
CREATE FUNCTION judgequeue.defer_lease(
    p_id bigint, p_generation bigint, p_attempt uuid, p_delay float8, p_failed boolean, p_reason text
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
           call_failures = call_failures + CASE WHEN p_failed THEN 1 ELSE 0 END
     WHERE id = p_id AND generation = p_generation AND attempt_id = p_attempt AND status = 'JUDGING'
    RETURNING queue, generation INTO v_queue, v_generation;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO judgequeue.outbox (queue, submission_id, generation, next_attempt_at, last_error)
        VALUES (v_queue, p_id, v_generation, now() + make_interval(secs => greatest(p_delay, 0)),
                left(p_reason, 1000));
    RETURN v_generation;
END $$;
