-- Verdict events: every verdict stored (by a worker, the lease reaper giving up, a dead-letter, a
-- failed dispatch, or plain SQL) writes one event row in the same transaction, and announces it at
-- the commit on judgequeue_events with the queue's name. Readers (core/store/events.py) take the
-- table as the truth and the notification as a wake-up. Webhook endpoints keep their read position
-- and their deliveries here, so a killed deliverer resumes where it stopped.
CREATE TABLE judgequeue.verdict_events (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    txid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    queue         text NOT NULL,
    submission_id bigint NOT NULL,
    generation    bigint NOT NULL,
    status        text NOT NULL,
    score         jsonb,
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX verdict_events_position ON judgequeue.verdict_events (txid, id);

CREATE INDEX verdict_events_retention ON judgequeue.verdict_events (queue, created_at);

-- The position horizon: every event of a transaction below it is committed (or never will be), and
-- every transaction still to commit one is at or above it. The oldest transaction still running
-- in this database, by the current snapshot; transactions of other databases of the server cannot
-- write these rows and are left out when pg_stat_activity names them (one it cannot name only
-- delays a read).
CREATE FUNCTION judgequeue.events_horizon() RETURNS xid8 LANGUAGE sql STABLE AS $$
    WITH snap AS MATERIALIZED (
        SELECT pg_current_snapshot() AS s
    ), elsewhere AS (
        SELECT backend_xid::text::bigint AS xid
          FROM pg_stat_activity
         WHERE backend_xid IS NOT NULL AND datname IS DISTINCT FROM current_database()
    )
    SELECT coalesce(min(x), (SELECT pg_snapshot_xmax(s) FROM snap))
      FROM snap, pg_snapshot_xip(snap.s) AS x
     WHERE (x::text::bigint % 4294967296) NOT IN (SELECT xid FROM elsewhere)
$$;

CREATE FUNCTION judgequeue.record_verdict_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO judgequeue.verdict_events (queue, submission_id, generation, status, score, reason)
    VALUES (NEW.queue, NEW.id, NEW.generation, NEW.status,
            CASE WHEN jsonb_typeof(NEW.verdict) = 'object' AND jsonb_typeof(NEW.verdict -> 'details') = 'object'
                 THEN NEW.verdict -> 'details' -> 'score' END,
            left(CASE WHEN jsonb_typeof(NEW.verdict) = 'object' THEN NEW.verdict ->> 'reason' END, 1000));
    PERFORM pg_notify('judgequeue_events', NEW.queue);
    RETURN NULL;
END $$;

CREATE TRIGGER submissions_verdict_event AFTER UPDATE OF status, generation ON judgequeue.submissions
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'JUDGING')
          AND (NEW.status, NEW.generation) IS DISTINCT FROM (OLD.status, OLD.generation))
    EXECUTE FUNCTION judgequeue.record_verdict_event();

CREATE TABLE judgequeue.webhook_endpoints (
    name        text PRIMARY KEY,
    queue       text NOT NULL,
    after_txid  xid8 NOT NULL DEFAULT '0',
    after_id    bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    read_at     timestamptz
);

CREATE TABLE judgequeue.webhook_deliveries (
    endpoint         text NOT NULL REFERENCES judgequeue.webhook_endpoints (name) ON DELETE CASCADE,
    event_id         bigint NOT NULL,
    submission_id    bigint NOT NULL,
    generation       bigint NOT NULL,
    body             jsonb NOT NULL,
    state            text NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'DEAD')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claimed_by       text,
    claim_expires_at timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint, event_id)
);

CREATE INDEX webhook_deliveries_submission ON judgequeue.webhook_deliveries (endpoint, submission_id, event_id)
    WHERE state = 'PENDING';
