-- Conveyor schema, version 1: the live jobs table, the partitioned archive, idempotency keys and
-- the operator audit log. Applied by PostgresBackend.migrate() inside one transaction that holds
-- an advisory lock, so concurrent migrators serialise and the second one finds nothing to do.

-- Live rows only (pending, processing). Terminal rows leave in the statement that ends them, so
-- this table stays small. fillfactor 70 leaves room on each page for the new row versions that
-- acquire/retry/extend write, and the fixed-threshold autovacuum settings (scale factor 0) make
-- vacuum run after a constant number of dead rows instead of after a fraction of a table whose
-- size swings between empty and millions of rows.
CREATE TABLE jobs (
    id               uuid        PRIMARY KEY,
    queue            text        NOT NULL,
    task             text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'processing')),
    priority         integer     NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL,
    enqueued_at      timestamptz NOT NULL,
    expires_at       timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    deliveries       integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    max_deliveries   integer     NOT NULL,
    idempotency_key  text,
    ordering_key     text,
    replay_of        uuid,
    first_started_at timestamptz,
    started_at       timestamptz,
    lease_expires_at timestamptz,
    worker_id        text,
    receipt          uuid,
    error_type       text,
    error_message    text,
    traceback        text,
    -- A receipt names the current delivery, so it exists exactly while the row is processing;
    -- outcome statements rely on it to find a delivery by (id, receipt) alone.
    CONSTRAINT jobs_receipt_iff_processing CHECK ((receipt IS NOT NULL) = (state = 'processing'))
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);

-- What acquire reads: the ready rows of one queue in delivery order. Partial, so processing rows
-- (and their churn) never enter it.
CREATE INDEX jobs_ready_idx ON jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
-- What rescue reads: leases in expiry order.
CREATE INDEX jobs_lease_idx ON jobs (lease_expires_at) WHERE state = 'processing';
-- Per-key FIFO: "is there a live row of my key with a smaller id?" is one index probe.
CREATE INDEX jobs_ordering_idx ON jobs (queue, ordering_key, id) WHERE ordering_key IS NOT NULL;
-- Per-key FIFO: "is a job of my key in flight?" reads only the (few) processing keyed rows.
CREATE INDEX jobs_ordering_inflight_idx ON jobs (queue, ordering_key)
    WHERE ordering_key IS NOT NULL AND state = 'processing';

-- Terminal rows, partitioned by day on finished_at so that retention drops whole partitions
-- instead of deleting rows (no vacuum storm, no bloat). The DEFAULT partition catches rows
-- outside the partitions created ahead (a clock far in the past or future); it should stay
-- empty in normal operation. Partitions are created by archive_partitions_ensure().
CREATE TABLE archive (
    id               uuid        NOT NULL,
    queue            text        NOT NULL,
    task             text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL,
    state            text        NOT NULL CHECK (state IN ('completed', 'dead', 'expired', 'cancelled')),
    priority         integer     NOT NULL,
    run_at           timestamptz NOT NULL,
    enqueued_at      timestamptz NOT NULL,
    expires_at       timestamptz,
    attempts         integer     NOT NULL,
    deliveries       integer     NOT NULL,
    max_attempts     integer     NOT NULL,
    max_deliveries   integer     NOT NULL,
    idempotency_key  text,
    ordering_key     text,
    replay_of        uuid,
    first_started_at timestamptz,
    started_at       timestamptz,
    lease_expires_at timestamptz,
    worker_id        text,
    error_type       text,
    error_message    text,
    traceback        text,
    finished_at      timestamptz NOT NULL,
    result           jsonb,
    reason           text,
    replayed_by      uuid,
    -- A unique key on a partitioned table must contain the partition key; (finished_at, id) is
    -- also exactly the order incremental export reads in.
    PRIMARY KEY (finished_at, id)
) PARTITION BY RANGE (finished_at);

CREATE TABLE archive_default PARTITION OF archive DEFAULT;

-- job_get, replay and purge look archived rows up by id alone.
CREATE INDEX archive_id_idx ON archive (id);
-- The DLQ: unreplayed dead letters, newest first.
CREATE INDEX archive_dead_idx ON archive (finished_at DESC, id DESC)
    WHERE state = 'dead' AND replayed_by IS NULL;
-- queue_load counts a queue's rows finished in a recent window (a range scan), and queues_stats
-- counts archived rows by queue and state (an index-only scan: state and replayed_by are INCLUDEd
-- so that the heap is not read). One index serves both, to keep archive inserts cheap.
CREATE INDEX archive_queue_finished_idx ON archive (queue, finished_at) INCLUDE (state, replayed_by);

-- Producer-side dedup: one row per held (queue, key). expires_at is the end of the key's window
-- (NULL: held for ever); an expired key may be taken over by a new job.
CREATE TABLE idempotency_keys (
    queue      text        NOT NULL,
    key        text        NOT NULL,
    job_id     uuid        NOT NULL,
    expires_at timestamptz,
    PRIMARY KEY (queue, key)
);

CREATE INDEX idempotency_keys_expires_idx ON idempotency_keys (expires_at);

-- Every operator action (replay, purge, ...).
CREATE TABLE audit (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    actor   text        NOT NULL,
    action  text        NOT NULL,
    reason  text        NOT NULL,
    job_ids uuid[]      NOT NULL,
    details jsonb       NOT NULL
);

-- Creates the daily archive partitions for [first_day, first_day + days] (UTC days) that do not
-- exist yet and returns their names. Called by migrate() and by the pruner, so partitions always
-- exist ahead of the rows that will land in them. A CREATE ... PARTITION OF would take an ACCESS
-- EXCLUSIVE lock on the archive and stall every finishing worker behind any long reader, so each
-- partition is created standalone and then ATTACHed (SHARE UPDATE EXCLUSIVE on the parent), with
-- a lock_timeout so that a blocked attach gives up (and is retried next time) rather than queue
-- the archive's writers behind it. A day that already has rows in the DEFAULT partition is left
-- there: attaching it would fail, and the rows stay readable either way.
CREATE FUNCTION conveyor_archive_partitions_ensure(first_day date, days integer)
RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    day  date;
    lo   timestamptz;
    hi   timestamptz;
    part text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('conveyor.archive_partitions', 0));
    PERFORM set_config('lock_timeout', '1s', true);
    FOR i IN 0..days LOOP
        day := first_day + i;
        part := 'archive_p' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(quote_ident(part)) IS NOT NULL;
        lo := day::timestamp AT TIME ZONE 'UTC';
        hi := (day + 1)::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN EXISTS (SELECT 1 FROM archive_default WHERE finished_at >= lo AND finished_at < hi);
        EXECUTE format('CREATE TABLE %I (LIKE archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
        EXECUTE format('ALTER TABLE archive ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', part, lo, hi);
        RETURN NEXT part;
    END LOOP;
END
$$;

-- Retention drops a whole daily partition once nothing in it is to be kept; the caller (the
-- pruner, through archive_prune) has checked that. Returns the number of rows dropped. Dropping
-- locks the whole archive for an instant, so a short lock_timeout makes a drop that would queue
-- behind a long reader give up (the pruner retries later) instead of stalling finishing workers.
CREATE FUNCTION conveyor_archive_partition_drop(part text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF part !~ '^archive_p[0-9]{8}$' OR NOT EXISTS (
        SELECT 1 FROM pg_inherits
        WHERE inhparent = 'archive'::regclass AND inhrelid = to_regclass(quote_ident(part))
    ) THEN
        RAISE EXCEPTION 'not an archive partition: %', part;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('conveyor.archive_partitions', 0));
    PERFORM set_config('lock_timeout', '1s', true);
    EXECUTE format('SELECT count(*) FROM %I', part) INTO n;
    EXECUTE format('DROP TABLE %I', part);
    RETURN n;
END
$$;

-- Consumer-side idempotency: a side effect named by key happened (ctx.once). Claimed in the
-- handler's own transaction when it has one, so the claim commits with the side effect.
CREATE TABLE processed_keys (
    key        text        PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    claimed_at timestamptz NOT NULL
);

CREATE INDEX processed_keys_expires_idx ON processed_keys (expires_at);

-- Cron schedules. Firing a tick is a compare-and-set on next_run_at, so however many schedulers
-- run, each tick fires once.
CREATE TABLE schedules (
    name        text        PRIMARY KEY,
    cron        text        NOT NULL,
    task        text        NOT NULL,
    queue       text        NOT NULL,
    payload     jsonb       NOT NULL,
    next_run_at timestamptz NOT NULL,
    paused      boolean     NOT NULL DEFAULT false,
    priority    integer     NOT NULL DEFAULT 0,
    last_run_at timestamptz
);

-- Topic fan-out: each published message whose headers match filter is copied to queue.
CREATE TABLE subscriptions (
    topic  text  NOT NULL,
    queue  text  NOT NULL,
    task   text  NOT NULL,
    filter jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (topic, queue)
);
