-- judgequeue's schema as it is now: every table, index, trigger and SQL function, in one file.
--
-- This file is where each thing is read and changed. A new database is given it in one go (see
-- core/migrate.py); an existing one takes the migrations it lacks (core/migrations/: every change
-- since the first version, frozen). tests/integration/test_schema.py checks that the history
-- replayed from empty, and every database an earlier version left, end in the same catalog as one
-- given this file. A change is written twice on purpose: here as the thing itself, and as a new
-- migration (never an edit of an applied one) that takes an existing database there.
--
-- All decisions use the database clock; nothing here trusts a client's time. Errors use SQLSTATEs
-- JQ001..JQ009 (core/errors.py).

-- === queues: the cutover flags of each queue =====================================================

-- owner: the one JudgeQueue whose flags these are (docs/gitops.md, "One owner per queue"); NULL for
-- a queue no JudgeQueue owns yet (created by the CLI or `judgequeue local`). Not a flag: changing it
-- leaves config_version alone.
-- offers_until: until when a worker's offer (worker_offers, below) may be open in this queue; NULL
-- for a queue no worker ever offered in (every stream-intake queue). submit() reads it with the
-- queue check and looks for an offer to fill only before it: a submit in a queue without offers
-- costs what it cost before offers existed. The workers' offers sync writes it
-- (core/direct/offers.py); not a flag either: the trigger leaves config_version, updated_at and the
-- flip lock alone.
CREATE TABLE judgequeue.queues (
    name            text PRIMARY KEY
                    CHECK (length(name) <= 63 AND name ~ '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'),
    mode            text NOT NULL DEFAULT 'live' CHECK (mode IN ('live', 'shadow')),
    watermark       timestamptz,
    paused          boolean NOT NULL DEFAULT false,
    config_version  bigint NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    owner           text CHECK (owner IS NULL OR length(owner) BETWEEN 1 AND 512),
    offers_until    timestamptz,
    -- the queue's priority classes, highest first, and each one's share of every claim's jobs
    -- (whole percent; the first class's 0; claim_plan()); checked by valid_classes() below
    classes         text[] NOT NULL DEFAULT ARRAY['default']::text[],
    class_shares    smallint[] NOT NULL DEFAULT ARRAY[0]::smallint[]
);

-- A flag flip (mode, watermark, paused) and a submit filling an offer exclude each other: the
-- submit decides on the flags it read and its decision takes effect at its commit, which may come
-- long after (the application's transaction), so a flip must not commit in between (invariant 4:
-- no live dispatch of a pre-watermark row, none after a pause or a rollback to shadow). Submits
-- that fill offers hold this key shared until they commit; a flip takes it exclusively, so it waits
-- for them (set_cutover bounds that wait and says so), and a submit that cannot get it at once (a
-- flip is waiting or running) writes a PENDING row, which the flags judge later. The rule needs a
-- fresh snapshot per statement: only READ COMMITTED transactions fill offers (see submit()).
CREATE FUNCTION judgequeue.offers_lock_key(p_queue text) RETURNS bigint LANGUAGE sql IMMUTABLE
    AS $$ SELECT (hashtext('judgequeue.offers')::bigint << 32) | (hashtext(p_queue)::bigint & 4294967295) $$;

-- The watermark only moves forward (clearing it would move it back to the beginning of time);
-- every real change bumps config_version so readers can tell which flags they acted on.
CREATE FUNCTION judgequeue.queues_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.mode, NEW.watermark, NEW.paused) IS DISTINCT FROM (OLD.mode, OLD.watermark, OLD.paused) THEN
        -- Already held when the flip came through judgequeue (set_cutover takes it first, with a
        -- bounded wait, before it locks this row); taken here for any other writer of the flags.
        PERFORM pg_advisory_xact_lock(judgequeue.offers_lock_key(NEW.name));
    END IF;
    IF OLD.watermark IS NOT NULL
       AND (NEW.watermark IS NULL OR NEW.watermark < OLD.watermark) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'JQ005',
            MESSAGE = format('queue %s: watermark may only move forward (current %s, requested %s)',
                             OLD.name, OLD.watermark, coalesce(NEW.watermark::text, 'none'));
    END IF;
    IF (NEW.mode, NEW.watermark, NEW.paused) IS DISTINCT FROM (OLD.mode, OLD.watermark, OLD.paused) THEN
        NEW.config_version := OLD.config_version + 1;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER queues_guard BEFORE UPDATE ON judgequeue.queues
    FOR EACH ROW EXECUTE FUNCTION judgequeue.queues_guard();

-- Whoever changes a queue's flags or owner (judgequeue, `judgequeue cutover set`, plain SQL), its
-- operator hears of it at the commit: a notification on judgequeue_queues carrying the queue's name
-- (core/queues.py listen_queues), so status never holds stale flags for a timer's interval. Flags and
-- owners change rarely; submits never write this table, and offers_until notifies nobody.
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

-- === submissions: the fence target ================================================================

-- No foreign key to queues on purpose: every submit would take a KEY SHARE lock on the same queue
-- row, and many concurrent lockers of one row turn into MultiXacts that cap commit throughput.
-- judgequeue.submit() checks the queue instead. The statuses are core/states.py's (a test compares).
-- fillfactor 70: a row is updated once or twice within moments of its insert (leased, then its
-- verdict), and the free third of its page keeps the new versions there instead of on the page
-- the submits are filling. End to end at saturation (bench.e2e, 1 worker): 68-70% of pgbench
-- against 62-66% with full pages (both tables then), at the same CPU per job.
CREATE TABLE judgequeue.submissions (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL,
    payload           jsonb NOT NULL,
    status            text NOT NULL DEFAULT 'PENDING' CHECK (status IN (
                          'PENDING', 'JUDGING', 'ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT',
                          'MEMORY_LIMIT', 'OUTPUT_LIMIT', 'IDLENESS_LIMIT', 'RUNTIME_ERROR',
                          'COMPILE_ERROR', 'PRESENTATION_ERROR', 'SYSTEM_ERROR', 'CANCELLED')),
    generation        bigint NOT NULL DEFAULT 1,
    attempt_id        uuid,
    lease_expires_at  timestamptz,
    retry_count       integer NOT NULL DEFAULT 0,
    verdict           jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    -- the generation a submit or a rejudge created: rescues, releases and deferrals bump the
    -- generation (the fence) but keep it, so a remote call's idempotency key (queue, submission,
    -- request_generation) is the same for every try of one request and new for a rejudge
    request_generation bigint NOT NULL DEFAULT 1,
    -- failed tries of this request (timeouts, connection errors, 5xx, 429): the remote-call judge's
    -- retry bound and backoff; waiting for a free endpoint slot does not count
    call_failures     integer NOT NULL DEFAULT 0,
    -- the class it was submitted or last rejudged in (NULL: the queue's first) and its fairness key
    -- (NULL: none): every later delivery (rescue, release, deferral) keeps both
    job_class         text,
    fair_key          text,
    -- a probe: the rejudging (judgequeue.rejudgings) it judges its submission again for, on the
    -- side; NULL for every submission an application made
    rejudging         bigint
) WITH (fillfactor = 70);

-- Serves the lease reaper: only JUDGING rows carry a lease.
CREATE INDEX submissions_lease ON judgequeue.submissions (lease_expires_at) WHERE status = 'JUDGING';

-- Submissions whose delivery was sent but never leased (Redis lost the entry): the reaper re-sends
-- the current generation's row. Only rows never leased in their generation are indexed, so the scan
-- costs what is waiting, and the lease query (which implies status = 'PENDING' but not
-- attempt_id IS NULL) can never pick this index.
CREATE INDEX submissions_never_leased ON judgequeue.submissions (queue, created_at)
    WHERE status = 'PENDING' AND attempt_id IS NULL;

-- Retention: the reaper deletes a queue's terminal submissions oldest first. Only finished rows
-- enter (every terminal status sets finished_at; a generation bump clears it).
CREATE INDEX submissions_finished ON judgequeue.submissions (queue, finished_at)
    WHERE finished_at IS NOT NULL;

-- === outbox: each generation's delivery intent ====================================================

-- Full pages, unlike submissions: most rows are written already sent by a filled offer, and the one
-- update of the others (claimed or taken) leaves the claim index anyway; the free room cost each
-- submit more page extensions for no gain at saturation.
CREATE TABLE judgequeue.outbox (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL,
    submission_id     bigint NOT NULL,
    generation        bigint NOT NULL,
    state             text NOT NULL DEFAULT 'PENDING' CHECK (state IN (
                          'PENDING', 'CLAIMED', 'SENT', 'DEAD', 'SKIPPED', 'SHADOW_SENT', 'CANCELLED')),
    attempts          integer NOT NULL DEFAULT 0,
    last_error        text,
    -- For PENDING rows: when the row may be tried (backoff). For CLAIMED rows: when the claim
    -- expires. One column lets one partial index serve both "ready" and "abandoned" rows.
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    claimed_by        text,
    claim_expires_at  timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    sent_at           timestamptz,
    UNIQUE (submission_id, generation),
    -- the rank of its submission's class (0: the first) and, with a fairness key, the key's turn in
    -- the class (fair_seq(); 0 without a key): the claim's order is (class_rank, fair_seq,
    -- next_attempt_at, id)
    class_rank        smallint NOT NULL DEFAULT 0,
    fair_key          text,
    fair_seq          bigint NOT NULL DEFAULT 0
);

CREATE INDEX outbox_claim ON judgequeue.outbox (queue, class_rank, fair_seq, next_attempt_at, id)
    WHERE state IN ('PENDING', 'CLAIMED');
-- A key's last waiting turn (fair_seq()).
CREATE INDEX outbox_fair_key ON judgequeue.outbox (queue, class_rank, fair_key, fair_seq)
    WHERE state IN ('PENDING', 'CLAIMED') AND fair_key IS NOT NULL;

-- Idle dispatchers (and direct-intake workers) register here before they block on LISTEN; submit()
-- notifies only while a waiter exists, so a busy system pays nothing for the wake-up (a NOTIFY per
-- commit serialises commits on the notification queue lock). UNLOGGED: soft state, lost on crash by
-- design.
CREATE UNLOGGED TABLE judgequeue.dispatch_waiters (
    queue       text NOT NULL,
    dispatcher  text NOT NULL,
    since       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, dispatcher)
);

-- === offers: an idle direct-intake worker's free slots, filled by submit() ========================

-- Soft state, like dispatch_waiters: lost in a crash by design (workers offer again; a job already
-- handed over keeps its lease). An offer not refreshed by expires_at is never filled (a dead worker
-- stops refreshing), and the reaper prunes old rows. Filling one sets submission/attempt (a HOT
-- update: no index changes); the worker deletes the row once it has the job.
CREATE UNLOGGED TABLE judgequeue.worker_offers (
    queue       text NOT NULL,
    worker      text NOT NULL,
    slot        integer NOT NULL,
    channel     text NOT NULL,                       -- the worker's own notification channel
    lease_ttl   float8 NOT NULL CHECK (lease_ttl > 0),
    expires_at  timestamptz NOT NULL,
    submission  bigint,                               -- set when a submit filled the offer
    attempt     uuid,
    -- NULL: any job. 0: one of a worker's reserved slots, kept for the queue's first class: filled only
    -- by a job of rank 0 that no waiting job of its class is ahead of (see submit()).
    max_rank    smallint,
    PRIMARY KEY (queue, worker, slot)
);

-- The largest payload a notification carries with its job (NOTIFY takes under 8,000 bytes); a
-- larger one the worker reads from the table.
CREATE FUNCTION judgequeue.offer_payload_bytes() RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT 7000 $$;

-- === submit, rejudge, and the generation bump =====================================================

-- Limits kept in one place so SQL and Python agree; submit() reads them.
CREATE FUNCTION judgequeue.max_payload_bytes() RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT 1048576 $$;

CREATE FUNCTION judgequeue.is_dns_label(p_name text) RETURNS boolean LANGUAGE sql IMMUTABLE
    AS $$ SELECT p_name IS NOT NULL AND length(p_name) <= 63
                 AND p_name ~ '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$' $$;

-- A queue's classes are valid: 1 to 16 distinct DNS labels, highest first, each with a share (whole
-- percent, 0-100, the first class's always 0) summing to at most 100.
CREATE FUNCTION judgequeue.valid_classes(p_names text[], p_shares smallint[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT cardinality(p_names) BETWEEN 1 AND 16
       AND cardinality(p_shares) = cardinality(p_names)
       AND p_shares[1] = 0
       AND (SELECT bool_and(judgequeue.is_dns_label(n)) AND count(DISTINCT n) = cardinality(p_names)
              FROM unnest(p_names) AS n)
       AND (SELECT bool_and(s BETWEEN 0 AND 100) AND sum(s) <= 100 FROM unnest(p_shares) AS s)
$$;

-- The rank of a class in a queue (0 = the first, highest): NULL is the first class; a name no
-- longer declared (a spec that dropped it after the job was queued) is the lowest.
CREATE FUNCTION judgequeue.class_rank(p_classes text[], p_class text) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (CASE WHEN p_class IS NULL THEN 0
                 ELSE coalesce(array_position(p_classes, p_class), cardinality(p_classes)) - 1 END)::smallint
$$;

-- The order in which one claim visits a queue's classes: by rank, except that with probability
-- share/100 a class with a share is visited first (it goes first in that share of the claims while
-- it has ready rows: the starvation bound of the classes below the first). PL/pgSQL: no planning per call.
CREATE FUNCTION judgequeue.claim_order(p_shares smallint[]) RETURNS smallint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_x float8;
    v_upto integer := 0;
    v_first integer;
    v_out smallint[] := '{}';
BEGIN
    IF cardinality(p_shares) = 1 THEN
        RETURN ARRAY[0]::smallint[];
    END IF;
    v_x := random() * 100;
    FOR i IN 1 .. cardinality(p_shares) LOOP
        IF v_first IS NULL AND v_x >= v_upto AND v_x < v_upto + p_shares[i] THEN
            v_first := i;
        END IF;
        v_upto := v_upto + p_shares[i];
    END LOOP;
    IF v_first IS NOT NULL THEN
        v_out := ARRAY[(v_first - 1)::smallint];
    END IF;
    FOR i IN 1 .. cardinality(p_shares) LOOP
        IF i IS DISTINCT FROM v_first THEN
            v_out := v_out || (i - 1)::smallint;
        END IF;
    END LOOP;
    RETURN v_out;
END $$;

-- The plan of one claim of p_limit rows (the classes to visit, how many rows of each, after skipping
-- how many): each class with a share first, for its share of the claim's rows (one draw rounds every
-- class: n*share/100 rows on average, at most one off, never more than n together), then every class
-- in rank order for the rest. claim_order() is kept for the statements of roles of an earlier version.
CREATE FUNCTION judgequeue.claim_plan(p_shares smallint[], p_limit integer)
RETURNS TABLE (rank smallint, quota integer, skip integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_draw float8;
    v_sum integer := 0;
    v_before integer := 0;
    v_upto integer;
    v_quotas integer[];
BEGIN
    IF cardinality(p_shares) = 1 THEN
        rank := 0; quota := p_limit; skip := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    v_draw := random();
    v_quotas := array_fill(0, ARRAY[cardinality(p_shares)]);
    FOR i IN 1 .. cardinality(p_shares) LOOP
        v_sum := v_sum + p_shares[i];
        v_upto := floor(p_limit * v_sum / 100.0 + v_draw)::integer;
        v_quotas[i] := v_upto - v_before;
        v_before := v_upto;
        IF v_quotas[i] > 0 THEN
            rank := i - 1; quota := v_quotas[i]; skip := 0;
            RETURN NEXT;
        END IF;
    END LOOP;
    -- The rest by rank; a class already visited skips the rows its share took (its own locks).
    FOR i IN 1 .. cardinality(p_shares) LOOP
        rank := i - 1; quota := p_limit; skip := v_quotas[i];
        RETURN NEXT;
    END LOOP;
END $$;

-- Fair share within a class: a job with a fairness key is ordered by a sequence number, one more than
-- the key's last waiting job, and never below the class's head (the lowest number still waiting),
-- so a key that had nothing waiting starts at the head beside a bursting key's next job, and keys
-- with waiting jobs take turns (start-time fair queuing). Jobs without a key are 0: first in their
-- class, in order of readiness, as in a queue with no keys. The head is read only for a key with
-- nothing waiting (a key's last waiting turn is at or past the head). Index probes of one entry
-- whatever the statistics: ORDER BY ... LIMIT 1 on the index's order (a max() was planned as an
-- aggregate over the key's every entry on a table analysed while small), and no sequential scan
-- inside the function (on such a table the head was read by a scan and a top-N sort of every
-- waiting row of the class, which made a keyed burst in one statement quadratic); in PL/pgSQL:
-- their plans are kept per session, where a SQL function's would be planned at every call.
CREATE FUNCTION judgequeue.fair_seq(p_queue text, p_rank smallint, p_key text) RETURNS bigint
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

-- Enqueue a submission inside the caller's transaction: the submission row and its delivery intent
-- commit or roll back together. With an open offer on a live queue (and its rows at or past the
-- watermark) the intent is delivered here: the submission is written already leased to the offering
-- worker (JUDGING, a fresh attempt, the lease on the database clock), its outbox row already SENT,
-- and that worker alone is notified with the job. The lease runs from the submit statement, not
-- from the commit: an application transaction that stays open longer than the lease TTL commits an
-- expired lease, which the reaper rescues like any other (a second run, fenced).
--
-- p_class: one of the queue's classes (NULL: the first, highest); p_key: the fairness key within the
-- class (a contest id; NULL: none). A class the queue does not declare is refused (JQ009) naming them.
--
-- A mode that is off costs nothing: in a queue where no offer can be open (queues.offers_until
-- NULL or past, as in every queue of the stream intake) a submit runs the statements it ran before
-- offers existed (the queue check, the two INSERTs, the waiters check), no more; a fairness key adds
-- the two probes of fair_seq(). Every lookup is an index probe whatever the statistics (no
-- sequential scan inside the function): on an outbox analysed while small, whether a waiting job of
-- the class is ahead of a first-class submit was answered by reading every waiting row.
CREATE FUNCTION judgequeue.submit(p_queue text, p_payload jsonb, p_class text DEFAULT NULL, p_key text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_id bigint;
    v_offers boolean;
    v_classes text[];
    v_rank smallint;
    v_seq bigint := 0;
    v_live boolean;
    v_offer record;
    v_text text;
    v_ahead boolean := false;
BEGIN
    IF NOT judgequeue.is_dns_label(p_queue) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ001',
            MESSAGE = format('queue name %L is not a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters)', p_queue);
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ004', MESSAGE = 'payload must be a JSON value, got NULL';
    END IF;
    IF octet_length(p_payload::text) > judgequeue.max_payload_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ003',
            MESSAGE = format('payload is %s bytes, over the limit of %s bytes',
                             octet_length(p_payload::text), judgequeue.max_payload_bytes());
    END IF;
    IF p_key IS NOT NULL AND (length(p_key) NOT BETWEEN 1 AND 200) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('fairness key must be 1 to 200 characters, got %s', length(p_key));
    END IF;
    -- The queue check reads whether an offer may be open: the sync that opens or refreshes a
    -- worker's offers moves offers_until at or past their expiry in the same statement (offers_sync
    -- in core/sql/queries.sql), so once it is past no offer of this queue is fillable. An offer the
    -- signal missed (that write skips a queue row locked by someone else) is harmless, only not
    -- filled: this submit writes a PENDING row and wakes the registered waiters as below, the
    -- offering worker among them (a worker offers while it waits, registered), which then takes
    -- its offers back and the row in (as for a rejudge or a rescue); a worker not woken looks
    -- within its schedule, and the dispatcher streams what no worker took.
    SELECT offers_until > clock_timestamp(), classes INTO v_offers, v_classes FROM judgequeue.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ002',
            MESSAGE = format('unknown queue %L (create it with: judgequeue queue create %s)', p_queue, p_queue);
    END IF;
    IF p_class IS NOT NULL AND NOT (p_class = ANY (v_classes)) THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ009',
            MESSAGE = format('class %L is not a class of queue %L (one of %s)', p_class, p_queue,
                             array_to_string(v_classes, ', '));
    END IF;
    v_rank := judgequeue.class_rank(v_classes, p_class);
    IF p_key IS NOT NULL THEN
        v_seq := judgequeue.fair_seq(p_queue, v_rank, p_key);
    END IF;

    -- Fill an open offer at once (locked for this transaction; other submits skip it); the
    -- submission id is drawn only for an offer filled. The lock below is taken only then, so a
    -- flip waits only for submits that fill offers. Only at READ COMMITTED: the flags must be read
    -- after that lock with a snapshot of their own, which a REPEATABLE READ or SERIALIZABLE
    -- transaction does not take (its snapshot may predate a flip), and such a transaction would
    -- also fail on offers changed since its snapshot (40001).
    IF v_offers THEN
        IF current_setting('transaction_isolation') = 'read committed' THEN
            -- A reserved offer (max_rank 0: a worker keeps a few slots for the first class of a queue
            -- with several) takes a first-class job only if no ready job of the class is ahead of it
            -- (a job without a key: one without a key is waiting; with a key: one of a lower turn), so
            -- it starts a job the next take would start first anyway, without waiting for that take.
            -- One probe of outbox_claim, only for first-class submits in a queue with several classes.
            IF v_rank = 0 AND cardinality(v_classes) > 1 THEN
                v_ahead := EXISTS (SELECT 1 FROM judgequeue.outbox o
                                    WHERE o.queue = p_queue AND o.class_rank = 0 AND o.state IN ('PENDING', 'CLAIMED')
                                      AND o.fair_seq <= CASE WHEN p_key IS NULL THEN 0 ELSE v_seq - 1 END
                                      AND o.next_attempt_at <= now());
            END IF;
            UPDATE judgequeue.worker_offers o
               SET submission = nextval('judgequeue.submissions_id_seq'::regclass), attempt = gen_random_uuid()
             WHERE o.ctid = (SELECT ctid FROM judgequeue.worker_offers
                              WHERE queue = p_queue AND submission IS NULL AND expires_at > clock_timestamp()
                                AND (max_rank IS NULL OR (v_rank <= max_rank AND NOT v_ahead))
                              LIMIT 1
                                FOR UPDATE SKIP LOCKED)
            RETURNING o.ctid AS at_ctid, o.submission, o.worker, o.slot, o.channel, o.lease_ttl, o.attempt
                 INTO v_offer;
            IF FOUND THEN
                v_id := v_offer.submission;
                IF pg_try_advisory_xact_lock_shared(judgequeue.offers_lock_key(p_queue)) THEN
                    -- Read after the lock: a flip committed before it is seen, one after it waits for this commit.
                    SELECT mode = 'live' AND NOT paused AND (watermark IS NULL OR watermark <= now())
                      INTO v_live
                      FROM judgequeue.queues WHERE name = p_queue;
                END IF;
                IF v_live THEN
                    INSERT INTO judgequeue.submissions (id, queue, payload, status, attempt_id, lease_expires_at,
                                                        job_class, fair_key)
                        OVERRIDING SYSTEM VALUE
                        VALUES (v_id, p_queue, p_payload, 'JUDGING', v_offer.attempt,
                                clock_timestamp() + make_interval(secs => v_offer.lease_ttl), p_class, p_key);
                    INSERT INTO judgequeue.outbox (queue, submission_id, generation, state, attempts, claimed_by, sent_at,
                                                   class_rank, fair_key)
                        VALUES (p_queue, v_id, 1, 'SENT', 1, v_offer.worker, now(), v_rank, p_key);
                    -- "<submission> <attempt> <slot> <created, epoch seconds>[ <payload>]"
                    v_text := p_payload::text;
                    PERFORM pg_notify(v_offer.channel, concat_ws(' ', v_id, v_offer.attempt, v_offer.slot,
                        extract(epoch FROM now()),
                        CASE WHEN octet_length(v_text) <= judgequeue.offer_payload_bytes() THEN v_text END));
                    RETURN v_id;
                END IF;
                -- Not handed over (a flip is under way; paused, shadow, before the watermark): open again.
                UPDATE judgequeue.worker_offers SET submission = NULL, attempt = NULL WHERE ctid = v_offer.at_ctid;
            END IF;
        END IF;
    END IF;

    -- (An id drawn for an offer given back above stays unused: a gap, as a rollback leaves.)
    INSERT INTO judgequeue.submissions (queue, payload, job_class, fair_key)
        VALUES (p_queue, p_payload, p_class, p_key) RETURNING id INTO v_id;
    INSERT INTO judgequeue.outbox (queue, submission_id, generation, class_rank, fair_key, fair_seq)
        VALUES (p_queue, v_id, 1, v_rank, p_key, v_seq);

    PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify('judgequeue_wakeup', p_queue);
    END IF;
    RETURN v_id;
END $$;

-- The delivery intent of a submission's new generation: an outbox row in the submission's class
-- (its rank in the queue's classes now) and fairness key, ready in p_delay seconds (database clock)
-- with p_reason as its last_error; a dispatcher waiting on the queue is woken when it is ready now.
-- The one re-queue of bump_generation() and defer_lease(), which differ only in the generation's update.
CREATE FUNCTION judgequeue.requeue(
    p_queue text, p_id bigint, p_generation bigint, p_class text, p_key text, p_delay float8, p_reason text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_rank smallint;
BEGIN
    SELECT judgequeue.class_rank(classes, p_class) INTO v_rank FROM judgequeue.queues WHERE name = p_queue;
    v_rank := coalesce(v_rank, 0);
    INSERT INTO judgequeue.outbox (queue, submission_id, generation, next_attempt_at, last_error,
                                   class_rank, fair_key, fair_seq)
        VALUES (p_queue, p_id, p_generation, now() + make_interval(secs => greatest(p_delay, 0)),
                left(p_reason, 1000), v_rank, p_key, judgequeue.fair_seq(p_queue, v_rank, p_key));
    IF p_delay <= 0 THEN
        PERFORM 1 FROM judgequeue.dispatch_waiters WHERE queue = p_queue LIMIT 1;
        IF FOUND THEN
            PERFORM pg_notify('judgequeue_wakeup', p_queue);
        END IF;
    END IF;
END $$;

-- Start a new generation of a submission and write its delivery intent, atomically. Any verdict
-- of an older generation is fenced out from then on. p_expected_generation (when given) makes the
-- bump conditional, so two actors racing to rescue the same attempt bump it once.
-- p_count_retry: a lease expiry or release counts towards maxRetries and keeps the request; a
-- user's rejudge resets the count and starts a new request (request_generation, call_failures).
-- The new delivery keeps the submission's class and fairness key (a rescued contest job stays a
-- contest job). Returns the new generation, or NULL when nothing was bumped.
CREATE FUNCTION judgequeue.bump_generation(
    p_submission_id bigint, p_expected_generation bigint, p_count_retry boolean
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_generation bigint;
    v_class text;
    v_key text;
BEGIN
    UPDATE judgequeue.submissions
       SET generation = generation + 1,
           status = 'PENDING',
           attempt_id = NULL,
           lease_expires_at = NULL,
           verdict = NULL,
           finished_at = NULL,
           retry_count = CASE WHEN p_count_retry THEN retry_count + 1 ELSE 0 END,
           request_generation = CASE WHEN p_count_retry THEN request_generation ELSE generation + 1 END,
           call_failures = CASE WHEN p_count_retry THEN call_failures ELSE 0 END
     WHERE id = p_submission_id
       AND (p_expected_generation IS NULL OR generation = p_expected_generation)
    RETURNING queue, generation, job_class, fair_key INTO v_queue, v_generation, v_class, v_key;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM judgequeue.requeue(v_queue, p_submission_id, v_generation, v_class, v_key, 0, NULL);
    RETURN v_generation;
END $$;

-- A user's rejudge of one submission, in the class p_class (NULL: the queue's lowest). The
-- submission's class becomes p_class: a rescue of the rejudged job keeps it. A rejudging's probe is
-- refused (JQ021): its verdict is that rejudging's proposal, judged once (a bulk rejudge skips it).
CREATE FUNCTION judgequeue.rejudge(p_submission_id bigint, p_class text DEFAULT NULL) RETURNS bigint
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
CREATE FUNCTION judgequeue.rejudge_many(
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

-- Give a lease back to be tried again no sooner than p_delay seconds from now (database clock):
-- fenced like a verdict on (id, generation, attempt, JUDGING); a new generation (older deliveries
-- are stale from then on) whose outbox row waits until then, with the reason as its last_error,
-- in the submission's class and with its fairness key.
-- p_failed: the try failed (counts in call_failures) rather than waited for a free slot. Unlike a
-- release it does not count towards maxRetries (lease expiries): the judge bounds its own tries.
-- Returns the new generation, or NULL when the lease was no longer held (the caller's try is stale).
CREATE FUNCTION judgequeue.defer_lease(
    p_id bigint, p_generation bigint, p_attempt uuid, p_delay float8, p_failed boolean, p_reason text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_generation bigint;
    v_class text;
    v_key text;
BEGIN
    UPDATE judgequeue.submissions
       SET generation = generation + 1,
           status = 'PENDING',
           attempt_id = NULL,
           lease_expires_at = NULL,
           call_failures = call_failures + CASE WHEN p_failed THEN 1 ELSE 0 END
     WHERE id = p_id AND generation = p_generation AND attempt_id = p_attempt AND status = 'JUDGING'
    RETURNING queue, generation, job_class, fair_key INTO v_queue, v_generation, v_class, v_key;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM judgequeue.requeue(v_queue, p_id, v_generation, v_class, v_key, p_delay, p_reason);
    RETURN v_generation;
END $$;

ALTER TABLE judgequeue.queues ADD CONSTRAINT queues_classes_valid
    CHECK (judgequeue.valid_classes(classes, class_shares));



-- === leases: the two operations that need a row lock, then bump_generation() =====================
-- (acquire, renew and verdict writes are single fenced UPDATEs in core/sql/queries.sql)

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

-- === dead letters: the Postgres record of a stream entry given up on ==============================

-- Recorded BEFORE Redis is touched (core/giving_up.py), so this is idempotent: running it again
-- for the same envelope changes nothing and reports why. Fenced on the envelope's generation, and
-- acting only while the submission is still PENDING: a JUDGING submission is owned by its lease
-- (the lease reaper recovers it), and a terminal or newer-generation one needs nothing.
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

-- === verdict events: the way back to the application (docs/events.md) ===========================

-- Every verdict stored (by a worker, the lease reaper giving up, a dead-letter, a failed dispatch,
-- or plain SQL) writes one event row in the same transaction: the trigger below, so no path that
-- stores a verdict can forget it. A generation has at most one verdict, so (queue, submission,
-- generation) names an event. The notification on judgequeue_events (payload: the queue) is only a
-- wake-up; readers (core/store/events.py) take the table as the truth and read in (txid, id) order
-- up to the oldest running transaction (pg_snapshot_xmin), so an event whose transaction commits
-- late is never jumped over. Pruned with the verdicts' retention (the reaper's prune).
CREATE TABLE judgequeue.verdict_events (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    txid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    queue         text NOT NULL,
    submission_id bigint NOT NULL,
    generation    bigint NOT NULL,
    status        text NOT NULL,
    score         jsonb,
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- 'progress': a judging attempt's live progress (opt-in per queue, JUDGEQUEUE_PROGRESS), written
    -- by its worker at most once per job per interval, fenced like its verdict; status is JUDGING and
    -- progress says how far it got (phase, tests done of total, the last test's verdict and time)
    kind          text NOT NULL DEFAULT 'verdict' CHECK (kind IN ('verdict', 'progress')),
    progress      jsonb
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
          AND (NEW.status, NEW.generation) IS DISTINCT FROM (OLD.status, OLD.generation)
          AND NEW.rejudging IS NULL)
    EXECUTE FUNCTION judgequeue.record_verdict_event();

-- === verdict history and cancelling (docs/cancel.md) ============================================

-- Every verdict a submission is given (per generation), with its cause: 'judged' (the submit's
-- request), 'rejudged' (a rejudge's or a DLQ replay's request), 'rescued' (a judging after a lease
-- expiry or a release), 'cancelled' (judgequeue.cancel()); 'applied' is kept for verdicts a
-- rejudging applies. Written by a trigger in the verdict's transaction; pruned with the retention.
CREATE TABLE judgequeue.verdict_history (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text NOT NULL,
    submission_id bigint NOT NULL,
    generation    bigint NOT NULL,
    status        text NOT NULL,
    cause         text NOT NULL CHECK (cause IN ('judged', 'rejudged', 'rescued', 'cancelled', 'applied')),
    verdict       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX verdict_history_submission ON judgequeue.verdict_history (submission_id, id);

CREATE INDEX verdict_history_retention ON judgequeue.verdict_history (queue, created_at);

-- The cause of a verdict, from the row that carries it: a cancellation; a judging after lease
-- expiries or releases (retry_count counts them, a rejudge resets it); a request a rejudge or a
-- replay started (request_generation past the submit's 1); else the submit's own judging.
CREATE FUNCTION judgequeue.record_verdict_history() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- The same rows as the verdict events' trigger: a verdict, new by status or generation.
CREATE TRIGGER submissions_verdict_history AFTER UPDATE OF status, generation ON judgequeue.submissions
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'JUDGING')
          AND (NEW.status, NEW.generation) IS DISTINCT FROM (OLD.status, OLD.generation)
          AND NEW.rejudging IS NULL)
    EXECUTE FUNCTION judgequeue.record_verdict_history();

-- Cancel a submission of p_queue, in the caller's transaction. Locks its waiting deliveries before
-- the submission (the order of a direct take and the dispatcher's mark, so none of them deadlocks
-- with a cancel). Returns the generation the submission is cancelled at and whether this call
-- cancelled it (false: it was cancelled already, nothing changed). A submission with a verdict is
-- cancelled too (its verdict stays in the history). Refuses a reason that is not 1 to 1000
-- characters (JQ010) and a submission not of p_queue (JQ006).
CREATE FUNCTION judgequeue.cancel(p_queue text, p_submission_id bigint, p_reason text)
RETURNS TABLE (generation bigint, cancelled_now boolean) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_generation bigint;
BEGIN
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ010',
            MESSAGE = format('reason must be 1 to 1000 characters (not only blanks), got %s',
                             coalesce(length(p_reason)::text, 'none'));
    END IF;
    PERFORM 1 FROM judgequeue.outbox o
     WHERE o.submission_id = p_submission_id AND o.state IN ('PENDING', 'CLAIMED')
       FOR UPDATE;
    SELECT s.status, s.generation INTO v_status, v_generation
      FROM judgequeue.submissions s
     WHERE s.id = p_submission_id AND s.queue = p_queue
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JQ006',
            MESSAGE = format('unknown submission %s in queue %L', p_submission_id, p_queue);
    END IF;
    IF v_status = 'CANCELLED' THEN
        RETURN QUERY SELECT v_generation, false;
        RETURN;
    END IF;
    UPDATE judgequeue.submissions s
       SET generation = s.generation + 1,
           status = 'CANCELLED',
           attempt_id = NULL,
           lease_expires_at = NULL,
           verdict = jsonb_build_object('status', 'CANCELLED', 'reason', p_reason,
                                        'generation', s.generation + 1, 'previous_status', v_status),
           finished_at = now()
     WHERE s.id = p_submission_id
    RETURNING s.generation INTO v_generation;
    UPDATE judgequeue.outbox o
       SET state = 'CANCELLED',
           last_error = left('cancelled: ' || p_reason, 1000),
           claim_expires_at = NULL,
           sent_at = now()
     WHERE o.submission_id = p_submission_id AND o.state IN ('PENDING', 'CLAIMED');
    IF v_status = 'JUDGING' THEN
        -- "<queue> <submission> <generation>": the worker judging it stops (core/roles/worker/cancels.py).
        PERFORM pg_notify('judgequeue_cancel', concat_ws(' ', p_queue, p_submission_id, v_generation));
    END IF;
    RETURN QUERY SELECT v_generation, true;
END $$;

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

-- === problem packages, uploaded once and referenced by (id, version) from payloads =============

-- Files are content-addressed (sha256) and stored in chunks, so a package of hundreds of MiB is
-- written in bounded statements and a file shared by two versions is stored once. A file row is
-- written in the same transaction as all its chunks, and a package row only after every file it
-- names: a reader never sees half a package. A package version is immutable: the same version
-- uploaded again must be byte-identical (its manifest digest is the cache key workers use).
CREATE TABLE judgequeue.problem_files (
    sha256      text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size        bigint NOT NULL CHECK (size >= 0),
    chunks      integer NOT NULL CHECK (chunks >= 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE judgequeue.problem_chunks (
    sha256  text NOT NULL REFERENCES judgequeue.problem_files ON DELETE CASCADE,
    seq     integer NOT NULL CHECK (seq >= 0),
    data    bytea NOT NULL,
    PRIMARY KEY (sha256, seq)
);

CREATE TABLE judgequeue.problems (
    id          text NOT NULL CHECK (length(id) <= 100 AND id ~ '^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$'),
    version     integer NOT NULL CHECK (version >= 1),
    manifest    jsonb NOT NULL,
    sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, version)
);

-- === shadow judging and the legacy verdicts it is compared with (docs/gitops.md) ==================

-- In shadow mode another (legacy) judge is authoritative: a submission's own status and verdict stay
-- as they are (PENDING). Shadow workers write a shadow verdict beside the submission, fenced like any
-- verdict (a lease: attempt, expiry; attempt NULL while waiting for a re-delivery); the application
-- reports the legacy judge's through report_legacy_verdict(). One row per submission: a newer
-- generation replaces the older one's.
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

-- === rejudgings: a rejudge as a proposal (docs/design.md, "Rejudgings") =====================

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
