-- Conveyor schema, version 7: scheduled jobs (run_at in the future when written) leave the ready index
-- (the PostgreSQL migration 0005_scheduled.sql has the whole reason). An acquire that found fewer ready
-- jobs than it asked for walked jobs_ready over every scheduled job of its queue, holding the write lock
-- all the while: 32 ms with 200,000 scheduled. Such a job is now 'scheduled', in jobs_scheduled by
-- run_at, and the acquire first makes the due ones pending (jobs_promote, in its transaction).
--
-- SQLite cannot change a CHECK constraint: the table is rebuilt (the columns as 0001 and 0004 left them)
-- and its indexes made again under their names.
CREATE TABLE jobs_new (
    id               TEXT    NOT NULL PRIMARY KEY,
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    headers          TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'scheduled', 'processing')),
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
    traceback        TEXT,
    rescues          INTEGER NOT NULL DEFAULT 0
);

INSERT INTO jobs_new
SELECT id, queue, task, payload, headers,
       CASE WHEN state = 'pending' AND run_at > (julianday('now') - 2440587.5) * 86400.0
            THEN 'scheduled' ELSE state END,
       priority, run_at, enqueued_at, expires_at, attempts, deliveries, max_attempts, max_deliveries,
       idempotency_key, ordering_key, replay_of, first_started_at, started_at, lease_expires_at,
       worker_id, receipt, error_type, error_message, traceback, rescues
FROM jobs;

DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;

CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX jobs_scheduled ON jobs (queue, run_at) WHERE state = 'scheduled';
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE state = 'processing';
CREATE INDEX jobs_ordering ON jobs (queue, ordering_key, id) WHERE ordering_key IS NOT NULL;
CREATE INDEX jobs_processing_queue ON jobs (queue) WHERE state = 'processing';
CREATE INDEX jobs_ordering_in_flight ON jobs (queue, ordering_key)
    WHERE state = 'processing' AND ordering_key IS NOT NULL;
