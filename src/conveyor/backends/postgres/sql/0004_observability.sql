-- Conveyor schema, version 4: what operators watch (issue 11): per-queue outcome counters, the worker
-- registry and alert states.
--
-- queue_counters: terminal totals per (queue, task), kept by jobs_finish_many in the same statement
-- that archives the jobs, so they are exact after a crash (they commit with the archive rows or not
-- at all), and queues_stats reads a few rows per queue instead of counting the archive (about 1 s per
-- 10M archived rows before). Each connection adds to its own stripe (`shard` = backend pid mod 8) so
-- that concurrent completers of one queue rarely wait for each other's row lock; readers sum the
-- stripes. The table is tiny and updated on every flush: fillfactor leaves room for HOT updates and
-- autovacuum runs on a fixed threshold, as on the jobs table. The seed below counts the archive once,
-- at migration time; retention never lowers the totals afterwards.
CREATE TABLE queue_counters (
    queue     text     NOT NULL,
    task      text     NOT NULL,
    shard     smallint NOT NULL,
    completed bigint   NOT NULL DEFAULT 0,
    dead      bigint   NOT NULL DEFAULT 0,
    expired   bigint   NOT NULL DEFAULT 0,
    cancelled bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, task, shard)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

INSERT INTO queue_counters (queue, task, shard, completed, dead, expired, cancelled)
SELECT queue, task, 0,
       count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'dead'),
       count(*) FILTER (WHERE state = 'expired'), count(*) FILTER (WHERE state = 'cancelled')
FROM archive
GROUP BY queue, task;

-- The DLQ depth per queue: an index of unreplayed dead letters by queue, so that queues_stats counts
-- the DLQ (small, and kept small by its alert) and never the rest of the archive.
CREATE INDEX archive_dlq_queue_idx ON archive (queue) WHERE state = 'dead' AND replayed_by IS NULL;

-- The worker registry: one row per worker process, written by its heartbeat. Its in-flight jobs
-- are not stored here: they are the processing rows whose worker_id is its id (exact, and free).
CREATE TABLE workers (
    id          text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    queues      text[]      NOT NULL,
    concurrency integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL
);

-- Alert states, written by the evaluators of `conveyor serve`. A state change is a compare-and-set
-- on this row, so that of several serving processes exactly one sends each notification. queue ''
-- is a database-wide alert.
CREATE TABLE alerts (
    rule       text             NOT NULL,
    queue      text             NOT NULL,
    state      text             NOT NULL CHECK (state IN ('firing', 'resolved')),
    since      timestamptz      NOT NULL,
    value      double precision NOT NULL,
    threshold  double precision NOT NULL,
    message    text             NOT NULL,
    updated_at timestamptz      NOT NULL,
    PRIMARY KEY (rule, queue)
);
