-- The initial Conveyor schema for SQLite.
--
-- Times are REAL unix seconds (UTC), ids are canonical lowercase UUID text (so that text order is
-- UUIDv7 order, i.e. enqueue order), payloads, headers and results are JSON text.

-- Live jobs only (pending and processing): terminal rows leave in the transaction that ends them,
-- so that the table acquire reads stays small however long the history grows.
CREATE TABLE jobs (
    id               TEXT    NOT NULL PRIMARY KEY,
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    headers          TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'processing')),
    priority         INTEGER NOT NULL,
    run_at           REAL    NOT NULL,
    enqueued_at      REAL    NOT NULL,
    expires_at       REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    deliveries       INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    max_deliveries   INTEGER NOT NULL,
    idempotency_key  TEXT,
    ordering_key     TEXT,
    replay_of        TEXT,
    first_started_at REAL,
    started_at       REAL,
    lease_expires_at REAL,
    worker_id        TEXT,
    receipt          TEXT,
    error_type       TEXT,
    error_message    TEXT,
    traceback        TEXT
);

-- Acquire walks this index in hand-out order and stops after LIMIT rows; it holds ready and
-- scheduled rows only, so leased rows never slow the walk down.
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';

-- Rescue finds expired leases without scanning pending rows.
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE state = 'processing';

-- The per-key FIFO head check ("is there a live row of this key with a smaller id?") is one
-- index probe; jobs without an ordering key stay out of the index.
CREATE INDEX jobs_ordering ON jobs (queue, ordering_key, id) WHERE ordering_key IS NOT NULL;

-- Terminal rows: completed, dead (the DLQ), expired, cancelled.
CREATE TABLE archive (
    id               TEXT    NOT NULL PRIMARY KEY,
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    headers          TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('completed', 'dead', 'expired', 'cancelled')),
    priority         INTEGER NOT NULL,
    run_at           REAL    NOT NULL,
    enqueued_at      REAL    NOT NULL,
    expires_at       REAL,
    attempts         INTEGER NOT NULL,
    deliveries       INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    max_deliveries   INTEGER NOT NULL,
    idempotency_key  TEXT,
    ordering_key     TEXT,
    replay_of        TEXT,
    first_started_at REAL,
    started_at       REAL,
    worker_id        TEXT,
    error_type       TEXT,
    error_message    TEXT,
    traceback        TEXT,
    finished_at      REAL    NOT NULL,
    result           TEXT,
    reason           TEXT,
    replayed_by      TEXT
);

-- Incremental export reads the archive in (finished_at, id) order after a watermark; retention
-- deletes from its old end.
CREATE INDEX archive_finished ON archive (finished_at, id);

-- The DLQ listing reads unreplayed dead letters newest first; replayed ones drop out of the index.
CREATE INDEX archive_dead ON archive (finished_at DESC, id DESC)
    WHERE state = 'dead' AND replayed_by IS NULL;

-- Queue stats count archived rows per queue and state from the index alone.
CREATE INDEX archive_queue_state ON archive (queue, state);

-- Producer-side deduplication: who holds each (queue, key) and until when (NULL: for ever).
CREATE TABLE idempotency_keys (
    queue      TEXT NOT NULL,
    key        TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    expires_at REAL,
    PRIMARY KEY (queue, key)
);

-- Operator actions (replay, purge): who, when, which jobs, why.
CREATE TABLE audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL    NOT NULL,
    actor   TEXT    NOT NULL,
    action  TEXT    NOT NULL,
    reason  TEXT    NOT NULL,
    job_ids TEXT    NOT NULL,
    details TEXT    NOT NULL
);
