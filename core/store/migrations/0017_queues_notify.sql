-- A queue's flags or owner changed by anyone (judgequeue, the CLI, plain SQL) is announced at the
-- commit on judgequeue_queues with the queue's name, for the operator (core/queues.py listen_queues).
CREATE FUNCTION judgequeue.queues_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('judgequeue_queues', OLD.name);
    ELSIF TG_OP = 'INSERT' OR (NEW.mode, NEW.watermark, NEW.paused, NEW.owner)
                              IS DISTINCT FROM (OLD.mode, OLD.watermark, OLD.paused, OLD.owner) THEN
        PERFORM pg_notify('judgequeue_queues', NEW.name);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER queues_notify AFTER INSERT OR UPDATE OR DELETE ON judgequeue.queues
    FOR EACH ROW EXECUTE FUNCTION judgequeue.queues_notify();
