-- judgequeue 0027: one check of what a rejudge of many submissions is given.
--
-- rejudge_many() and rejudging_preview() each checked the queue, the class and that a filter was
-- given, in the same thirteen lines; judgequeue.selection_class() now does it for both, with the
-- same errors and messages. Behaviour is unchanged.

-- What a rejudge of many submissions (rejudge_many(), rejudging_preview()) checks first, named by
-- p_what in its errors: queue p_queue exists (JQ002), p_class is one of its classes (JQ009, listing
-- them) and p_filtered (at least one filter given: JQ009). Returns the class it runs in (p_class, or
-- the queue's lowest), that class's rank and the queue's mode.
CREATE FUNCTION judgequeue.selection_class(p_queue text, p_class text, p_what text, p_filtered boolean)
RETURNS TABLE (job_class text, class_rank smallint, mode text) LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_classes text[];
    v_mode text;
    v_class text;
BEGIN
    SELECT q.classes, q.mode INTO v_classes, v_mode FROM judgequeue.queues q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ002',
            MESSAGE = format('unknown queue %L (create it with: judgequeue queue create %s)', p_queue, p_queue);
    END IF;
    IF p_class IS NOT NULL AND NOT (p_class = ANY (v_classes)) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('class %L is not a class of queue %L (one of %s)', p_class, p_queue,
                             array_to_string(v_classes, ', '));
    END IF;
    IF NOT p_filtered THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('%s needs at least one of: ids, problem, since, until', p_what);
    END IF;
    v_class := coalesce(p_class, v_classes[cardinality(v_classes)]);
    RETURN QUERY SELECT v_class, judgequeue.class_rank(v_classes, v_class), v_mode;
END $$;

-- A bulk rejudge of a queue's submissions in one statement: those in p_ids (NULL: any), of problem
-- p_problem (the payload's "problem"; NULL: any), created in [p_since, p_until) (NULL: unbounded),
-- at least one filter given; all in class p_class (NULL: the queue's lowest). Each gets a new
-- generation and delivery, as rejudge() gives one; keyed ones are numbered in turn per key. A
-- rejudging's probe is never selected. Returns each rejudged submission with its new generation.
CREATE OR REPLACE FUNCTION judgequeue.rejudge_many(
    p_queue text, p_class text, p_ids bigint[], p_problem text, p_since timestamptz, p_until timestamptz
) RETURNS TABLE (submission_id bigint, generation bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_class text;
    v_rank smallint;
BEGIN
    SELECT c.job_class, c.class_rank INTO v_class, v_rank
      FROM judgequeue.selection_class(p_queue, p_class, 'a bulk rejudge',
                                      p_ids IS NOT NULL OR p_problem IS NOT NULL
                                      OR p_since IS NOT NULL OR p_until IS NOT NULL) c;
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
CREATE OR REPLACE FUNCTION judgequeue.rejudging_preview(
    p_queue text, p_class text, p_ids bigint[], p_problem text, p_since timestamptz, p_until timestamptz
) RETURNS TABLE (rejudging bigint, previewed integer, left_out integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_mode text;
    v_class text;
    v_rank smallint;
    v_id bigint;
    v_previewed integer;
    v_left_out integer;
BEGIN
    SELECT c.job_class, c.class_rank, c.mode INTO v_class, v_rank, v_mode
      FROM judgequeue.selection_class(p_queue, p_class, 'a rejudging',
                                      p_ids IS NOT NULL OR p_problem IS NOT NULL
                                      OR p_since IS NOT NULL OR p_until IS NOT NULL) c;
    IF v_mode <> 'live' THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ021',
            MESSAGE = format('queue %L is in %s mode: a rejudging is judged by its live workers', p_queue, v_mode);
    END IF;
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
