-- judgequeue 0002: the reaper's Postgres record of dead-lettered stream entries.
--
-- The reaper records a dead letter in Postgres BEFORE it touches Redis (see core/reaper.py), so
-- this function must be idempotent: running it again for the same envelope changes nothing and
-- reports why. It is fenced on the envelope's generation and acts only while the submission is
-- still PENDING: a JUDGING submission is owned by its lease (the lease reaper recovers it), and a
-- terminal or newer-generation one needs nothing.
--
-- One call handles a batch (parallel arrays); it returns one outcome per input position:
--   'recorded'                  submission -> SYSTEM_ERROR with the reason, outbox row -> DEAD
--                               (now, or by an earlier call: the repeat reports the same outcome)
--   'unknown'                   no such submission
--   'superseded'                the submission moved on to a newer generation
--   lower(status), e.g. 'judging', 'system_error', 'accepted'   left alone
CREATE FUNCTION judgequeue.record_dead_letters(
    p_submission_ids bigint[], p_generations bigint[], p_reasons text[]
) RETURNS TABLE (ord bigint, outcome text) LANGUAGE sql AS $$
    WITH input AS (
        SELECT i.submission_id, i.generation, i.reason, i.ord
          FROM unnest(p_submission_ids, p_generations, p_reasons)
               WITH ORDINALITY AS i(submission_id, generation, reason, ord)
    ), failed AS (
        UPDATE judgequeue.submissions s
           SET status = 'SYSTEM_ERROR',
               verdict = jsonb_build_object('status', 'SYSTEM_ERROR', 'reason', i.reason,
                                            'source', 'reaper'),
               attempt_id = NULL,
               lease_expires_at = NULL,
               finished_at = now()
          FROM input i
         WHERE s.id = i.submission_id AND s.generation = i.generation AND s.status = 'PENDING'
        RETURNING s.id, s.generation, i.reason
    ), dead AS (
        UPDATE judgequeue.outbox o
           SET state = 'DEAD',
               last_error = f.reason,
               claim_expires_at = NULL,
               sent_at = now()
          FROM failed f
         WHERE o.submission_id = f.id AND o.generation = f.generation
        RETURNING o.id
    )
    SELECT i.ord,
           CASE
               WHEN f.id IS NOT NULL THEN 'recorded'
               WHEN s.id IS NULL THEN 'unknown'
               WHEN s.generation <> i.generation THEN 'superseded'
               WHEN s.status = 'SYSTEM_ERROR' AND s.verdict ->> 'source' = 'reaper' THEN 'recorded'
               ELSE lower(s.status)
           END
      FROM input i
      LEFT JOIN (SELECT DISTINCT id, generation FROM failed) f
             ON f.id = i.submission_id AND f.generation = i.generation
      LEFT JOIN judgequeue.submissions s ON s.id = i.submission_id
     ORDER BY i.ord
$$;
