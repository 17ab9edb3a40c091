-- fair_seq()'s probe of a key's last waiting job reads one index entry whatever the statistics say.
-- Written as max(), the planner chose between max()'s one-entry backward scan and an aggregate over
-- every waiting entry of the key by the table's statistics: on a table analysed while small (a new
-- database, a queue's first contest) it took the aggregate, and a burst of one key slowed its own
-- submits as it grew (3,000 waiting jobs: 1-3 ms a submit, 10x a submit without a key). An ORDER BY
-- on the index's order with LIMIT 1 is read from the index's end under any estimate.
CREATE OR REPLACE FUNCTION judgequeue.fair_seq(p_queue text, p_rank smallint, p_key text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_last bigint;
    v_head bigint;
BEGIN
    IF p_key IS NULL THEN
        RETURN 0;
    END IF;
    SELECT o.fair_seq INTO v_last FROM judgequeue.outbox o
     WHERE o.queue = p_queue AND o.class_rank = p_rank AND o.fair_key = p_key
       AND o.state IN ('PENDING', 'CLAIMED')
     ORDER BY o.fair_seq DESC LIMIT 1;
    SELECT o.fair_seq - 1 INTO v_head FROM judgequeue.outbox o
     WHERE o.queue = p_queue AND o.class_rank = p_rank AND o.state IN ('PENDING', 'CLAIMED') AND o.fair_seq > 0
     ORDER BY o.fair_seq LIMIT 1;
    RETURN greatest(v_last, v_head, 0) + 1;
END $$;
