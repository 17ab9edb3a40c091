-- judgequeue 0003: worker leases. Acquire, renew and verdict writes are single fenced UPDATEs kept
-- in core/leases.py; the two operations that need a row lock followed by bump_generation() live
-- here so each is one round trip and one transaction. Database clock only.

-- Give back leases a worker cannot finish (graceful shutdown): each lease still held by exactly
-- this (generation, attempt) gets a new generation and outbox row, so another worker takes it at
-- once. Counts towards maxRetries (see bump_generation). Returns the released submission ids.
CREATE FUNCTION judgequeue.release_leases(
    p_ids bigint[], p_generations bigint[], p_attempts uuid[]
) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT s.id, s.generation
          FROM judgequeue.submissions s
          JOIN unnest(p_ids, p_generations, p_attempts) AS l(id, generation, attempt)
            ON s.id = l.id AND s.generation = l.generation AND s.attempt_id = l.attempt
         WHERE s.status = 'JUDGING'
         ORDER BY s.id
           FOR UPDATE OF s
    LOOP
        IF judgequeue.bump_generation(r.id, r.generation, true) IS NOT NULL THEN
            RETURN NEXT r.id;
        END IF;
    END LOOP;
END $$;

-- Rescue expired JUDGING leases of a queue (the worker died or lost its connection): a new
-- generation and outbox row (retry_count + 1), or SYSTEM_ERROR once the expiries reach
-- p_max_retries. SKIP LOCKED lets several reapers sweep at once; a worker's renew that commits
-- first makes the row no longer expired, and one that waits on our lock finds the generation moved.
CREATE FUNCTION judgequeue.rescue_expired_leases(
    p_queue text, p_max_retries integer, p_batch integer, OUT requeued integer, OUT failed integer
) LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    requeued := 0;
    failed := 0;
    FOR r IN
        SELECT id, generation, retry_count
          FROM judgequeue.submissions
         WHERE status = 'JUDGING' AND lease_expires_at < now() AND queue = p_queue
         ORDER BY lease_expires_at
         LIMIT p_batch
           FOR UPDATE SKIP LOCKED
    LOOP
        IF r.retry_count + 1 >= p_max_retries THEN
            UPDATE judgequeue.submissions
               SET status = 'SYSTEM_ERROR',
                   retry_count = r.retry_count + 1,
                   lease_expires_at = NULL,
                   finished_at = now(),
                   verdict = jsonb_build_object(
                       'status', 'SYSTEM_ERROR',
                       'reason', format('gave up after %s lease expiries', r.retry_count + 1))
             WHERE id = r.id;
            failed := failed + 1;
        ELSIF judgequeue.bump_generation(r.id, r.generation, true) IS NOT NULL THEN
            requeued := requeued + 1;
        END IF;
    END LOOP;
END $$;
