-- judgequeue 0030: fair_seq() reads the class's head only for a key with nothing waiting.
--
-- A key's last waiting turn is one of the class's waiting turns, so it is at or past the class's
-- head: when the key has one, the head cannot change the answer, and the second probe (along
-- outbox_claim from the head, over the entries of rows taken since the last vacuum) was wasted.
-- A keyed submit into a line of its own now reads one index entry. Same results as before.
CREATE OR REPLACE FUNCTION judgequeue.fair_seq(p_queue text, p_rank smallint, p_key text) RETURNS bigint
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
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
    IF v_last > 0 THEN
        RETURN v_last + 1;  -- a waiting turn of the class: at or past its head
    END IF;
    SELECT o.fair_seq - 1 INTO v_head FROM judgequeue.outbox o
     WHERE o.queue = p_queue AND o.class_rank = p_rank AND o.state IN ('PENDING', 'CLAIMED') AND o.fair_seq > 0
     ORDER BY o.fair_seq LIMIT 1;
    RETURN greatest(v_last, v_head, 0) + 1;
END $$;
