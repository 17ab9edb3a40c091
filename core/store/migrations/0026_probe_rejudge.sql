-- judgequeue 0026: a rejudging's probe is not rejudged by id.
--
-- A probe (submissions.rejudging set) is a rejudging's proposal, judged once on the side; a bulk
-- rejudge already never selects one. judgequeue.rejudge() of a probe's id now refuses it (JQ021,
-- naming the rejudging) instead of judging the proposal again.

-- A user's rejudge of one submission, in the class p_class (NULL: the queue's lowest). The
-- submission's class becomes p_class: a rescue of the rejudged job keeps it. A rejudging's probe is
-- refused (JQ021): its verdict is that rejudging's proposal, judged once (a bulk rejudge skips it).
CREATE OR REPLACE FUNCTION judgequeue.rejudge(p_submission_id bigint, p_class text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_generation bigint;
    v_queue text;
    v_classes text[];
    v_rejudging bigint;
BEGIN
    SELECT s.queue, q.classes, s.rejudging INTO v_queue, v_classes, v_rejudging
      FROM judgequeue.submissions s LEFT JOIN judgequeue.queues q ON q.name = s.queue
     WHERE s.id = p_submission_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006',
            MESSAGE = format('unknown submission %s', p_submission_id);
    END IF;
    IF v_rejudging IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ021',
            MESSAGE = format('submission %s is a probe of rejudging %s, not a submission to rejudge: '
                             'preview its submission again instead', p_submission_id, v_rejudging);
    END IF;
    v_classes := coalesce(v_classes, ARRAY['default']);
    IF p_class IS NOT NULL AND NOT (p_class = ANY (v_classes)) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('class %L is not a class of queue %L (one of %s)', p_class, v_queue,
                             array_to_string(v_classes, ', '));
    END IF;
    UPDATE judgequeue.submissions
       SET job_class = coalesce(p_class, v_classes[cardinality(v_classes)])
     WHERE id = p_submission_id;
    v_generation := judgequeue.bump_generation(p_submission_id, NULL, false);
    IF v_generation IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006',
            MESSAGE = format('unknown submission %s', p_submission_id);
    END IF;
    RETURN v_generation;
END $$;
