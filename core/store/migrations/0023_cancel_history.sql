-- judgequeue 0023: a verdict history per submission, and cancelling a submission.
--
-- Every verdict a submission is given (per generation) is kept in judgequeue.verdict_history with
-- its cause, written by a trigger in the verdict's own transaction, so the history can never miss
-- one: 'judged' (the submit's request), 'rejudged' (a rejudge's or a DLQ replay's request),
-- 'rescued' (a judging after a lease expiry or a release), 'cancelled' (judgequeue.cancel());
-- 'applied' is kept for verdicts a rejudging applies. Pruned with the verdicts' retention.
--
-- judgequeue.cancel(queue, submission, reason) ends a submission as CANCELLED in the caller's
-- transaction: a new generation (every earlier attempt is fenced out, its stream entries stale),
-- its waiting deliveries CANCELLED (never claimed or taken), and, when it was being judged, a
-- notification on judgequeue_cancel that tells the worker to stop. Idempotent; a rejudge reopens it.
-- The two CHECK constraints are made again, as 0008 did: the migration reads both tables once while
-- it holds them (writes to them wait for its commit).
ALTER TABLE judgequeue.submissions DROP CONSTRAINT submissions_status_check;
ALTER TABLE judgequeue.submissions ADD CONSTRAINT submissions_status_check CHECK (status IN (
    'PENDING', 'JUDGING', 'ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT', 'OUTPUT_LIMIT',
    'IDLENESS_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR', 'PRESENTATION_ERROR', 'SYSTEM_ERROR',
    'CANCELLED'));
ALTER TABLE judgequeue.outbox DROP CONSTRAINT outbox_state_check;
ALTER TABLE judgequeue.outbox ADD CONSTRAINT outbox_state_check CHECK (state IN (
    'PENDING', 'CLAIMED', 'SENT', 'DEAD', 'SKIPPED', 'SHADOW_SENT', 'CANCELLED'));

CREATE TABLE judgequeue.verdict_history (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text NOT NULL,
    submission_id bigint NOT NULL,
    generation    bigint NOT NULL,
    status        text NOT NULL,
    cause         text NOT NULL CHECK (cause IN ('judged', 'rejudged', 'rescued', 'cancelled', 'applied')),
    verdict       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX verdict_history_submission ON judgequeue.verdict_history (submission_id, id);

CREATE INDEX verdict_history_retention ON judgequeue.verdict_history (queue, created_at);

-- The cause of a verdict, from the row that carries it: a cancellation; a judging after lease
-- expiries or releases (retry_count counts them, a rejudge resets it); a request a rejudge or a
-- replay started (request_generation past the submit's 1); else the submit's own judging.
CREATE FUNCTION judgequeue.record_verdict_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO judgequeue.verdict_history (queue, submission_id, generation, status, cause, verdict)
    VALUES (NEW.queue, NEW.id, NEW.generation, NEW.status,
            CASE WHEN NEW.status = 'CANCELLED' THEN 'cancelled'
                 WHEN NEW.retry_count > 0 THEN 'rescued'
                 WHEN NEW.request_generation > 1 THEN 'rejudged'
                 ELSE 'judged' END,
            NEW.verdict);
    RETURN NULL;
END $$;

-- The same rows as the verdict events' trigger: a verdict, new by status or generation.
CREATE TRIGGER submissions_verdict_history AFTER UPDATE OF status, generation ON judgequeue.submissions
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'JUDGING')
          AND (NEW.status, NEW.generation) IS DISTINCT FROM (OLD.status, OLD.generation))
    EXECUTE FUNCTION judgequeue.record_verdict_history();

-- Cancel a submission of p_queue, in the caller's transaction. Locks its waiting deliveries before
-- the submission (the order of a direct take and the dispatcher's mark, so none of them deadlocks
-- with a cancel). Returns the generation the submission is cancelled at and whether this call
-- cancelled it (false: it was cancelled already, nothing changed). A submission with a verdict is
-- cancelled too (its verdict stays in the history). Refuses a reason that is not 1 to 1000
-- characters (JQ010) and a submission not of p_queue (JQ006).
CREATE FUNCTION judgequeue.cancel(p_queue text, p_submission_id bigint, p_reason text)
RETURNS TABLE (generation bigint, cancelled_now boolean) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_generation bigint;
BEGIN
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ010',
            MESSAGE = format('reason must be 1 to 1000 characters (not only blanks), got %s',
                             coalesce(length(p_reason)::text, 'none'));
    END IF;
    PERFORM 1 FROM judgequeue.outbox o
     WHERE o.submission_id = p_submission_id AND o.state IN ('PENDING', 'CLAIMED')
       FOR UPDATE;
    SELECT s.status, s.generation INTO v_status, v_generation
      FROM judgequeue.submissions s
     WHERE s.id = p_submission_id AND s.queue = p_queue
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006',
            MESSAGE = format('unknown submission %s in queue %L', p_submission_id, p_queue);
    END IF;
    IF v_status = 'CANCELLED' THEN
        RETURN QUERY SELECT v_generation, false;
        RETURN;
    END IF;
    UPDATE judgequeue.submissions s
       SET generation = s.generation + 1,
           status = 'CANCELLED',
           attempt_id = NULL,
           lease_expires_at = NULL,
           verdict = jsonb_build_object('status', 'CANCELLED', 'reason', p_reason,
                                        'generation', s.generation + 1, 'previous_status', v_status),
           finished_at = now()
     WHERE s.id = p_submission_id
    RETURNING s.generation INTO v_generation;
    UPDATE judgequeue.outbox o
       SET state = 'CANCELLED',
           last_error = left('cancelled: ' || p_reason, 1000),
           claim_expires_at = NULL,
           sent_at = now()
     WHERE o.submission_id = p_submission_id AND o.state IN ('PENDING', 'CLAIMED');
    IF v_status = 'JUDGING' THEN
        -- "<queue> <submission> <generation>": the worker judging it stops (core/roles/worker/cancels.py).
        PERFORM pg_notify('judgequeue_cancel', concat_ws(' ', p_queue, p_submission_id, v_generation));
    END IF;
    RETURN QUERY SELECT v_generation, true;
END $$;
