-- judgequeue 0025: rejudgings, a rejudge as a proposal (docs/design.md, "Rejudgings").
--
-- judgequeue.rejudging_preview() judges a queue's submissions again *on the side*: each selected
-- submission (one with a verdict) gets a *probe*, a submission of its own in the same queue with
-- the same payload and fairness key, in the rejudging's class, marked with the rejudging's id
-- (submissions.rejudging). A probe is an ordinary job: the workers lease, judge and fence it, the
-- reaper rescues it, exactly as any submission; its verdict is the proposed verdict. The submission
-- itself (status, verdict, generation) is not touched. A probe's verdicts are neither verdict events
-- nor history (the two triggers skip it), and a bulk rejudge never selects one.
--
-- judgequeue.rejudging_apply() makes every proposed verdict visible in one transaction: a new
-- generation of the submission carrying the probe's verdict (any job of an older generation is
-- fenced out), recorded in the history as 'applied' and emitted as a verdict event by the usual
-- triggers. A submission whose generation moved since the preview (rejudged, cancelled, applied
-- from another rejudging) keeps its verdict: its proposal is stale and reported as such.
-- judgequeue.rejudging_cancel() discards a rejudging: its probes still waiting are cancelled
-- (judgequeue.cancel(): never started, or stopped), no visible verdict changes.

ALTER TABLE judgequeue.submissions ADD COLUMN rejudging bigint;

CREATE TABLE judgequeue.rejudgings (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text NOT NULL,
    job_class     text NOT NULL,
    state         text NOT NULL DEFAULT 'OPEN' CHECK (state IN ('OPEN', 'APPLIED', 'CANCELLED')),
    selection     jsonb NOT NULL,           -- what was asked: ids, problem, since, until
    left_out      integer NOT NULL DEFAULT 0,  -- selected but without a verdict (waiting, cancelled)
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,              -- applied or cancelled
    applied       integer,                  -- at apply: proposals made visible,
    stale         integer,                  -- skipped because the submission moved on,
    missing       integer                   -- and not judged yet (a partial apply)
);

CREATE INDEX rejudgings_queue ON judgequeue.rejudgings (queue, created_at);

-- One per previewed submission: what it was at the preview, and its probe.
CREATE TABLE judgequeue.rejudging_items (
    rejudging        bigint NOT NULL REFERENCES judgequeue.rejudgings (id) ON DELETE CASCADE,
    submission_id    bigint NOT NULL,
    base_generation  bigint NOT NULL,
    old_status       text NOT NULL,
    old_verdict      jsonb,
    probe            bigint NOT NULL,
    outcome          text CHECK (outcome IN ('applied', 'stale', 'missing')),
    PRIMARY KEY (rejudging, submission_id)
);

CREATE INDEX rejudging_items_probe ON judgequeue.rejudging_items (probe);

-- The two verdict triggers skip probes; the history names a verdict a rejudging applied 'applied'
-- (judgequeue.rejudging_apply() says so for its own statement).
DROP TRIGGER submissions_verdict_event ON judgequeue.submissions;
CREATE TRIGGER submissions_verdict_event AFTER UPDATE OF status, generation ON judgequeue.submissions
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'JUDGING')
          AND (NEW.status, NEW.generation) IS DISTINCT FROM (OLD.status, OLD.generation)
          AND NEW.rejudging IS NULL)
    EXECUTE FUNCTION judgequeue.record_verdict_event();

DROP TRIGGER submissions_verdict_history ON judgequeue.submissions;
CREATE TRIGGER submissions_verdict_history AFTER UPDATE OF status, generation ON judgequeue.submissions
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'JUDGING')
          AND (NEW.status, NEW.generation) IS DISTINCT FROM (OLD.status, OLD.generation)
          AND NEW.rejudging IS NULL)
    EXECUTE FUNCTION judgequeue.record_verdict_history();

CREATE OR REPLACE FUNCTION judgequeue.record_verdict_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO judgequeue.verdict_history (queue, submission_id, generation, status, cause, verdict)
    VALUES (NEW.queue, NEW.id, NEW.generation, NEW.status,
            CASE WHEN NEW.status = 'CANCELLED' THEN 'cancelled'
                 WHEN current_setting('judgequeue.cause', true) = 'applied' THEN 'applied'
                 WHEN NEW.retry_count > 0 THEN 'rescued'
                 WHEN NEW.request_generation > 1 THEN 'rejudged'
                 ELSE 'judged' END,
            NEW.verdict);
    RETURN NULL;
END $$;

-- A bulk rejudge never selects a probe (it is the same as 0019's otherwise).
CREATE OR REPLACE FUNCTION judgequeue.rejudge_many(
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
           AND s.rejudging IS NULL
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

-- Open a rejudging of p_queue's submissions selected as rejudge_many() selects them (ids, problem,
-- creation time; at least one), judged in class p_class (NULL: the queue's lowest). Only
-- submissions with a verdict are previewed (one waiting for its verdict or cancelled is left out
-- and counted); each gets a probe and its delivery, keyed ones numbered in turn per key. Refused on
-- a queue in shadow mode (nothing would judge the probes live). Returns the rejudging's id, how
-- many submissions it previews and how many selected were left out.
CREATE FUNCTION judgequeue.rejudging_preview(
    p_queue text, p_class text, p_ids bigint[], p_problem text, p_since timestamptz, p_until timestamptz
) RETURNS TABLE (rejudging bigint, previewed integer, left_out integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_classes text[];
    v_mode text;
    v_class text;
    v_rank smallint;
    v_id bigint;
    v_previewed integer;
    v_left_out integer;
BEGIN
    SELECT classes, mode INTO v_classes, v_mode FROM judgequeue.queues WHERE name = p_queue;
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
            MESSAGE = 'a rejudging needs at least one of: ids, problem, since, until';
    END IF;
    IF v_mode <> 'live' THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ021',
            MESSAGE = format('queue %L is in %s mode: a rejudging is judged by its live workers', p_queue, v_mode);
    END IF;
    v_class := coalesce(p_class, v_classes[cardinality(v_classes)]);
    v_rank := judgequeue.class_rank(v_classes, v_class);
    INSERT INTO judgequeue.rejudgings (queue, job_class, selection)
    VALUES (p_queue, v_class, jsonb_strip_nulls(jsonb_build_object(
        'ids', to_jsonb(p_ids), 'problem', p_problem, 'since', p_since, 'until', p_until)))
    RETURNING id INTO v_id;
    WITH chosen AS (
        SELECT s.id, s.generation, s.status, s.verdict, s.payload, s.fair_key,
               nextval('judgequeue.submissions_id_seq'::regclass) AS probe
          FROM judgequeue.submissions s
         WHERE s.queue = p_queue
           AND s.rejudging IS NULL
           AND s.status = ANY (judgequeue.verdict_names())
           AND (p_ids IS NULL OR s.id = ANY (p_ids))
           AND (p_problem IS NULL OR s.payload ->> 'problem' = p_problem)
           AND (p_since IS NULL OR s.created_at >= p_since)
           AND (p_until IS NULL OR s.created_at < p_until)
         ORDER BY s.id
    ), items AS (
        INSERT INTO judgequeue.rejudging_items (rejudging, submission_id, base_generation, old_status, old_verdict, probe)
        SELECT v_id, c.id, c.generation, c.status, c.verdict, c.probe FROM chosen c
    ), probes AS (
        INSERT INTO judgequeue.submissions (id, queue, payload, job_class, fair_key, rejudging)
            OVERRIDING SYSTEM VALUE
        SELECT c.probe, p_queue, c.payload, v_class, c.fair_key, v_id FROM chosen c
        RETURNING id
    ), numbered AS (
        SELECT c.probe, c.fair_key,
               CASE WHEN c.fair_key IS NULL THEN 0
                    ELSE judgequeue.fair_seq(p_queue, v_rank, c.fair_key)
                         + row_number() OVER (PARTITION BY c.fair_key ORDER BY c.probe) - 1 END AS seq
          FROM chosen c
    ), queued AS (
        INSERT INTO judgequeue.outbox (queue, submission_id, generation, class_rank, fair_key, fair_seq)
        SELECT p_queue, n.probe, 1, v_rank, n.fair_key, n.seq FROM numbered n ORDER BY n.probe
        RETURNING 1
    )
    SELECT count(*) INTO v_previewed FROM queued;
    SELECT count(*) INTO v_left_out
      FROM judgequeue.submissions s
     WHERE s.queue = p_queue
       AND s.rejudging IS NULL
       AND NOT (s.status = ANY (judgequeue.verdict_names()))
       AND (p_ids IS NULL OR s.id = ANY (p_ids))
       AND (p_problem IS NULL OR s.payload ->> 'problem' = p_problem)
       AND (p_since IS NULL OR s.created_at >= p_since)
       AND (p_until IS NULL OR s.created_at < p_until);
    UPDATE judgequeue.rejudgings SET left_out = v_left_out WHERE id = v_id;
    IF v_previewed > 0 THEN
        PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
        IF FOUND THEN
            PERFORM pg_notify('judgequeue_wakeup', p_queue);
        END IF;
    END IF;
    RETURN QUERY SELECT v_id, v_previewed, v_left_out;
END $$;

-- The rejudging p_rejudging of p_queue, locked; refuses an unknown one (JQ020).
CREATE FUNCTION judgequeue.rejudging_lock(p_queue text, p_rejudging bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
BEGIN
    SELECT r.state INTO v_state FROM judgequeue.rejudgings r
     WHERE r.id = p_rejudging AND r.queue = p_queue
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ020',
            MESSAGE = format('unknown rejudging %s in queue %L', p_rejudging, p_queue);
    END IF;
    RETURN v_state;
END $$;

-- Apply rejudging p_rejudging of p_queue in the caller's transaction: every proposed verdict (a
-- probe's verdict) becomes its submission's, at a new generation, unless the submission moved on
-- since the preview (stale: kept as it is). Refused while proposals are missing (probes not judged
-- yet) unless p_partial, when only the judged ones apply and the others' probes are cancelled; and
-- for a cancelled rejudging (JQ021). Applying an applied one changes nothing (applied_now false).
-- Returns how many applied, were stale and were missing.
CREATE FUNCTION judgequeue.rejudging_apply(p_queue text, p_rejudging bigint, p_partial boolean)
RETURNS TABLE (applied integer, stale integer, missing integer, applied_now boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_state text;
    v_total integer;
    v_missing integer;
    v_applied integer;
    v_stale integer;
    v_probe bigint;
BEGIN
    v_state := judgequeue.rejudging_lock(p_queue, p_rejudging);
    IF v_state = 'CANCELLED' THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ021',
            MESSAGE = format('rejudging %s was cancelled: it cannot be applied', p_rejudging);
    END IF;
    IF v_state = 'APPLIED' THEN
        RETURN QUERY SELECT r.applied, r.stale, r.missing, false FROM judgequeue.rejudgings r WHERE r.id = p_rejudging;
        RETURN;
    END IF;
    SELECT count(*), count(*) FILTER (WHERE p.status IS NULL OR NOT (p.status = ANY (judgequeue.verdict_names())))
      INTO v_total, v_missing
      FROM judgequeue.rejudging_items i LEFT JOIN judgequeue.submissions p ON p.id = i.probe
     WHERE i.rejudging = p_rejudging;
    IF v_missing > 0 AND NOT p_partial THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ021',
            MESSAGE = format('rejudging %s is missing %s of its %s proposed verdicts (still being judged):'
                             ' wait, or apply it partially to apply the %s judged', p_rejudging, v_missing,
                             v_total, v_total - v_missing);
    END IF;
    PERFORM set_config('judgequeue.cause', 'applied', true);
    WITH judged AS (
        SELECT i.submission_id, i.base_generation, i.probe, p.status, p.verdict
          FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe
         WHERE i.rejudging = p_rejudging AND p.status = ANY (judgequeue.verdict_names())
    ), made AS (
        UPDATE judgequeue.submissions s
           SET generation = s.generation + 1,
               status = j.status,
               verdict = CASE WHEN jsonb_typeof(j.verdict) = 'object'
                              THEN j.verdict || jsonb_build_object('generation', s.generation + 1,
                                                                   'rejudging', p_rejudging, 'probe', j.probe)
                              ELSE j.verdict END,
               attempt_id = NULL,
               lease_expires_at = NULL,
               finished_at = now(),
               retry_count = 0,
               request_generation = s.generation + 1,
               call_failures = 0
          FROM judged j
         WHERE s.id = j.submission_id AND s.generation = j.base_generation
           AND s.status = ANY (judgequeue.verdict_names())
        RETURNING s.id
    ), marked AS (
        UPDATE judgequeue.rejudging_items i
           SET outcome = CASE WHEN i.submission_id IN (SELECT id FROM made) THEN 'applied'
                              WHEN i.submission_id IN (SELECT submission_id FROM judged) THEN 'stale'
                              ELSE 'missing' END
         WHERE i.rejudging = p_rejudging
        RETURNING i.outcome
    )
    SELECT count(*) FILTER (WHERE outcome = 'applied'), count(*) FILTER (WHERE outcome = 'stale')
      INTO v_applied, v_stale FROM marked;
    PERFORM set_config('judgequeue.cause', '', true);
    -- A partial apply: the probes still waiting will never be applied; stop them.
    FOR v_probe IN
        SELECT p.id FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe
         WHERE i.rejudging = p_rejudging AND p.status IN ('PENDING', 'JUDGING')
         ORDER BY p.id
    LOOP
        PERFORM judgequeue.cancel(p_queue, v_probe, format('rejudging %s applied without it', p_rejudging));
    END LOOP;
    UPDATE judgequeue.rejudgings r
       SET state = 'APPLIED', finished_at = now(), applied = v_applied, stale = v_stale, missing = v_missing
     WHERE r.id = p_rejudging;
    RETURN QUERY SELECT v_applied, v_stale, v_missing, true;
END $$;

-- Discard rejudging p_rejudging of p_queue in the caller's transaction: its probes still waiting
-- are cancelled (never started; a running one is stopped, its verdict fenced out), every visible
-- verdict stays. Refused for an applied rejudging (JQ021); cancelling a cancelled one changes
-- nothing (cancelled_now false). Returns whether this call cancelled it and the probes it stopped.
CREATE FUNCTION judgequeue.rejudging_cancel(p_queue text, p_rejudging bigint)
RETURNS TABLE (cancelled_now boolean, stopped integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_state text;
    v_probe bigint;
    v_stopped integer := 0;
BEGIN
    v_state := judgequeue.rejudging_lock(p_queue, p_rejudging);
    IF v_state = 'APPLIED' THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ021',
            MESSAGE = format('rejudging %s was applied: it cannot be cancelled (rejudge the submissions instead)',
                             p_rejudging);
    END IF;
    IF v_state = 'CANCELLED' THEN
        RETURN QUERY SELECT false, 0;
        RETURN;
    END IF;
    FOR v_probe IN
        SELECT p.id FROM judgequeue.rejudging_items i JOIN judgequeue.submissions p ON p.id = i.probe
         WHERE i.rejudging = p_rejudging AND p.status IN ('PENDING', 'JUDGING')
         ORDER BY p.id
    LOOP
        PERFORM judgequeue.cancel(p_queue, v_probe, format('rejudging %s cancelled', p_rejudging));
        v_stopped := v_stopped + 1;
    END LOOP;
    UPDATE judgequeue.rejudgings r SET state = 'CANCELLED', finished_at = now() WHERE r.id = p_rejudging;
    RETURN QUERY SELECT true, v_stopped;
END $$;
