-- judgequeue 0012: shadow judging and the legacy verdicts it is compared with (docs/gitops.md).
--
-- In shadow mode another (legacy) judge is authoritative: a submission's own status and verdict
-- stay as they are (PENDING), whatever is judged here. Workers that opt in (JUDGEQUEUE_SHADOW=judge)
-- judge the shadow stream with the same judge and sandbox and write a *shadow verdict* beside the
-- submission; the application reports the legacy judge's verdict through
-- judgequeue.report_legacy_verdict(); the two are compared per queue and per verdict class
-- (core/agreement.py says what "agree" means).
--
-- A shadow verdict is fenced like any verdict: a shadow worker takes a lease on the row (a fresh
-- attempt, an expiry on the database clock), renews it, and writes its verdict only while it still
-- holds that (generation, attempt) and the row is JUDGING. A lease that expires is taken over by the
-- next delivery or re-sent by the reaper (attempt NULL: waiting for a delivery), so a stale shadow
-- result is dropped, never written. One row per submission: a newer generation (a rejudge in shadow
-- mode) replaces the older one's.

CREATE TABLE judgequeue.shadow_verdicts (
    submission_id     bigint PRIMARY KEY,
    queue             text NOT NULL,
    generation        bigint NOT NULL,
    attempt           uuid,                  -- NULL while JUDGING: waiting for a (re-)delivery
    status            text NOT NULL CHECK (status IN (
                          'JUDGING', 'ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT',
                          'OUTPUT_LIMIT', 'IDLENESS_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR',
                          'PRESENTATION_ERROR', 'SYSTEM_ERROR')),
    details           jsonb,                 -- the judge's details (per-test results, score, reason)
    worker            text,
    lease_expires_at  timestamptz,
    retry_count       integer NOT NULL DEFAULT 0,   -- lease expiries of this generation (maxRetries)
    started_at        timestamptz NOT NULL DEFAULT now(),
    judged_at         timestamptz
);

-- The reaper's rescue of expired shadow leases: only JUDGING rows carry one.
CREATE INDEX shadow_verdicts_lease ON judgequeue.shadow_verdicts (lease_expires_at) WHERE status = 'JUDGING';
-- A queue's rows in submission order: the agreement figures join the two tables on it.
CREATE INDEX shadow_verdicts_queue ON judgequeue.shadow_verdicts (queue, submission_id);
-- Retention, oldest first (every final shadow verdict has judged_at).
CREATE INDEX shadow_verdicts_judged ON judgequeue.shadow_verdicts (queue, judged_at) WHERE judged_at IS NOT NULL;

-- The legacy judge's verdict of a submission, as the application reported it (the last report wins:
-- the legacy judge may judge a submission again).
CREATE TABLE judgequeue.legacy_verdicts (
    submission_id  bigint PRIMARY KEY,
    queue          text NOT NULL,
    status         text NOT NULL CHECK (status IN (
                       'ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT', 'OUTPUT_LIMIT',
                       'IDLENESS_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR', 'PRESENTATION_ERROR',
                       'SYSTEM_ERROR')),
    details        jsonb,
    reported_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX legacy_verdicts_queue ON judgequeue.legacy_verdicts (queue, submission_id);
CREATE INDEX legacy_verdicts_reported ON judgequeue.legacy_verdicts (queue, reported_at);

-- The verdict names, in the order docs list them (core/states.py VERDICTS; a test compares them).
CREATE FUNCTION judgequeue.verdict_names() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT', 'OUTPUT_LIMIT',
                       'IDLENESS_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR', 'PRESENTATION_ERROR',
                       'SYSTEM_ERROR'] $$;

-- Record the legacy judge's verdict of a submission, inside the caller's transaction (like submit()).
-- Accepted for a submission of a queue in shadow mode, and for one that was sent to shadow judging
-- (a legacy verdict may come in after the flip to live); refused, with nothing written, for a bad
-- verdict name or details (JQ008), details over the payload limit (JQ003), an unknown submission
-- (JQ006), and a submission of a queue not in shadow mode that was never shadowed (JQ007).
CREATE FUNCTION judgequeue.report_legacy_verdict(
    p_submission_id bigint, p_verdict text, p_details jsonb DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_mode text;
BEGIN
    IF p_verdict IS NULL OR NOT (p_verdict = ANY (judgequeue.verdict_names())) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ008',
            MESSAGE = format('legacy verdict %s is not a verdict (one of %s)',
                             coalesce(quote_literal(p_verdict), 'NULL'),
                             array_to_string(judgequeue.verdict_names(), ', '));
    END IF;
    IF p_details IS NOT NULL AND jsonb_typeof(p_details) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ008',
            MESSAGE = format('legacy verdict details must be a JSON object or NULL, got a JSON %s',
                             jsonb_typeof(p_details));
    END IF;
    IF octet_length(p_details::text) > judgequeue.max_payload_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ003',
            MESSAGE = format('legacy verdict details are %s bytes, over the limit of %s bytes',
                             octet_length(p_details::text), judgequeue.max_payload_bytes());
    END IF;
    IF p_submission_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006', MESSAGE = 'unknown submission NULL';
    END IF;
    SELECT s.queue INTO v_queue FROM judgequeue.submissions s WHERE s.id = p_submission_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006', MESSAGE = format('unknown submission %s', p_submission_id);
    END IF;
    SELECT q.mode INTO v_mode FROM judgequeue.queues q WHERE q.name = v_queue;
    IF v_mode IS DISTINCT FROM 'shadow'
       AND NOT EXISTS (SELECT 1 FROM judgequeue.outbox o
                        WHERE o.submission_id = p_submission_id AND o.state = 'SHADOW_SENT')
       AND NOT EXISTS (SELECT 1 FROM judgequeue.shadow_verdicts v WHERE v.submission_id = p_submission_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ007',
            MESSAGE = format('submission %s is in queue %L, which is %s and never sent it to shadow judging:'
                             ' a legacy verdict is compared only with a shadow verdict (report it while'
                             ' the queue is in shadow mode)', p_submission_id, v_queue,
                             coalesce(v_mode || ' mode', 'gone'));
    END IF;
    INSERT INTO judgequeue.legacy_verdicts (submission_id, queue, status, details)
    VALUES (p_submission_id, v_queue, p_verdict, p_details)
    ON CONFLICT (submission_id) DO UPDATE
        SET status = excluded.status, details = excluded.details, queue = excluded.queue, reported_at = now();
END $$;
