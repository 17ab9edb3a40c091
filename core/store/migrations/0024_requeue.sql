-- bump_generation() and defer_lease() share one re-queue, judgequeue.requeue(): the outbox row of a
-- submission's new generation in its class and fairness key. Behaviour is unchanged, except that a
-- lease deferred for no time wakes a waiting dispatcher as a bump does.

-- The delivery intent of a submission's new generation: an outbox row in the submission's class
-- (its rank in the queue's classes now) and fairness key, ready in p_delay seconds (database clock)
-- with p_reason as its last_error; a dispatcher waiting on the queue is woken when it is ready now.
-- The one re-queue of bump_generation() and defer_lease(), which differ only in the generation's update.
CREATE FUNCTION judgequeue.requeue(
    p_queue text, p_id bigint, p_generation bigint, p_class text, p_key text, p_delay float8, p_reason text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_rank smallint;
BEGIN
    SELECT judgequeue.class_rank(classes, p_class) INTO v_rank FROM judgequeue.queues WHERE name = p_queue;
    v_rank := coalesce(v_rank, 0);
    INSERT INTO judgequeue.outbox (queue, submission_id, generation, next_attempt_at, last_error,
                                   class_rank, fair_key, fair_seq)
        VALUES (p_queue, p_id, p_generation, now() + make_interval(secs => greatest(p_delay, 0)),
                left(p_reason, 1000), v_rank, p_key, judgequeue.fair_seq(p_queue, v_rank, p_key));
    IF p_delay <= 0 THEN
        PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
        IF FOUND THEN
            PERFORM pg_notify('judgequeue_wakeup', p_queue);
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION judgequeue.bump_generation(
    p_submission_id bigint, p_expected_generation bigint, p_count_retry boolean
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_generation bigint;
    v_class text;
    v_key text;
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
    PERFORM judgequeue.requeue(v_queue, p_submission_id, v_generation, v_class, v_key, 0, NULL);
    RETURN v_generation;
END $$;

CREATE OR REPLACE FUNCTION judgequeue.defer_lease(
    p_id bigint, p_generation bigint, p_attempt uuid, p_delay float8, p_failed boolean, p_reason text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_generation bigint;
    v_class text;
    v_key text;
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
    PERFORM judgequeue.requeue(v_queue, p_id, v_generation, v_class, v_key, p_delay, p_reason);
    RETURN v_generation;
END $$;
