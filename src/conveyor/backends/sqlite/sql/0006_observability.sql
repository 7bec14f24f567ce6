-- Conveyor schema, version 6: per-queue outcome counters, the worker registry and alert states
-- (the PostgreSQL migration 0004_observability.sql has the reasons). SQLite has one writer at a
-- time, so the counters need no stripes. Times are seconds since the epoch (REAL), as elsewhere.
CREATE TABLE queue_counters (
    queue     TEXT    NOT NULL,
    task      TEXT    NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    dead      INTEGER NOT NULL DEFAULT 0,
    expired   INTEGER NOT NULL DEFAULT 0,
    cancelled INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, task)
);

INSERT INTO queue_counters (queue, task, completed, dead, expired, cancelled)
SELECT queue, task, sum(state = 'completed'), sum(state = 'dead'), sum(state = 'expired'), sum(state = 'cancelled')
FROM archive
GROUP BY queue, task;

CREATE INDEX archive_dlq_queue ON archive (queue) WHERE state = 'dead' AND replayed_by IS NULL;

CREATE TABLE workers (
    id          TEXT    PRIMARY KEY,
    host        TEXT    NOT NULL,
    pid         INTEGER NOT NULL,
    queues      TEXT    NOT NULL,
    concurrency INTEGER NOT NULL,
    started_at  REAL    NOT NULL,
    last_seen   REAL    NOT NULL
);

CREATE TABLE alerts (
    rule       TEXT NOT NULL,
    queue      TEXT NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('firing', 'resolved')),
    since      REAL NOT NULL,
    value      REAL NOT NULL,
    threshold  REAL NOT NULL,
    message    TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (rule, queue)
);
