-- The Conveyor schema for MySQL and MariaDB (InnoDB), in one migration: the engine arrived after the
-- PostgreSQL and SQLite schemas had settled, so it starts where their later migrations ended.
--
-- Storage follows the SQLite engine's, so both share their conversions: times are DOUBLE unix
-- seconds (UTC; a double holds a microsecond exactly at today's magnitudes), ids are canonical
-- lowercase UUID text in ascii_bin (text order is UUIDv7 order, i.e. enqueue order), payloads,
-- headers and results are JSON text. Names and keys compare byte for byte and without padding
-- (utf8mb4_nopad_bin, which migrate() swaps for utf8mb4_0900_bin on MySQL): with a PAD SPACE
-- collation the queue 'q ' would be the queue 'q', and 'K' the key 'k' under a case-insensitive one.
-- Indexed text is sized to the limits checked above the seam (conveyor._limits: names 200
-- characters, keys 512 bytes) and fits InnoDB's 3,072-byte index entries in utf8mb4.
--
-- InnoDB has no partial indexes: where PostgreSQL and SQLite index only the rows in one state,
-- the state leads the index here, which gives the same ranges.

-- Live jobs only (pending, scheduled, processing); terminal rows move to the archive in the
-- transaction that ends them.
CREATE TABLE jobs (
    id               CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    queue            VARCHAR(200) NOT NULL,
    task             VARCHAR(200) NOT NULL,
    payload          LONGTEXT     NOT NULL,
    headers          LONGTEXT     NOT NULL,
    state            VARCHAR(12) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    priority         INT          NOT NULL,
    run_at           DOUBLE       NOT NULL,
    enqueued_at      DOUBLE       NOT NULL,
    expires_at       DOUBLE,
    attempts         INT          NOT NULL DEFAULT 0,
    deliveries       INT          NOT NULL DEFAULT 0,
    max_attempts     INT          NOT NULL,
    max_deliveries   INT          NOT NULL,
    idempotency_key  VARCHAR(512),
    ordering_key     VARCHAR(512),
    replay_of        CHAR(36) CHARACTER SET ascii COLLATE ascii_bin,
    first_started_at DOUBLE,
    started_at       DOUBLE,
    lease_expires_at DOUBLE,
    worker_id        VARCHAR(700),
    receipt          VARCHAR(64),
    error_type       LONGTEXT,
    error_message    LONGTEXT,
    traceback        LONGTEXT,
    rescues          INT          NOT NULL DEFAULT 0,
    CONSTRAINT jobs_state CHECK (state IN ('pending', 'scheduled', 'processing')),
    -- Acquire walks the queue's pending range in hand-out order and stops after LIMIT rows.
    INDEX jobs_ready (queue, state, priority DESC, run_at, id),
    -- Scheduled jobs by due time, for jobs_promote and the next-due probe.
    INDEX jobs_scheduled (queue, state, run_at),
    -- Rescue finds expired leases without scanning pending rows; workers_list finds a worker's leases.
    INDEX jobs_lease (state, lease_expires_at),
    INDEX jobs_worker (worker_id, state),
    -- The per-key FIFO checks (head of its key; a job of its key in flight) are one probe each.
    INDEX jobs_ordering (queue, ordering_key, id),
    INDEX jobs_ordering_in_flight (queue, ordering_key, state)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Terminal rows: completed, dead (the DLQ), expired, cancelled.
CREATE TABLE archive (
    id               CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    queue            VARCHAR(200) NOT NULL,
    task             VARCHAR(200) NOT NULL,
    payload          LONGTEXT     NOT NULL,
    headers          LONGTEXT     NOT NULL,
    state            VARCHAR(12) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    priority         INT          NOT NULL,
    run_at           DOUBLE       NOT NULL,
    enqueued_at      DOUBLE       NOT NULL,
    expires_at       DOUBLE,
    attempts         INT          NOT NULL,
    deliveries       INT          NOT NULL,
    max_attempts     INT          NOT NULL,
    max_deliveries   INT          NOT NULL,
    idempotency_key  VARCHAR(512),
    ordering_key     VARCHAR(512),
    replay_of        CHAR(36) CHARACTER SET ascii COLLATE ascii_bin,
    first_started_at DOUBLE,
    started_at       DOUBLE,
    worker_id        VARCHAR(700),
    error_type       LONGTEXT,
    error_message    LONGTEXT,
    traceback        LONGTEXT,
    finished_at      DOUBLE       NOT NULL,
    result           LONGTEXT,
    reason           LONGTEXT,
    replayed_by      CHAR(36) CHARACTER SET ascii COLLATE ascii_bin,
    rescues          INT          NOT NULL DEFAULT 0,
    CONSTRAINT archive_state CHECK (state IN ('completed', 'dead', 'expired', 'cancelled')),
    -- Export reads in (finished_at, id) order after a watermark; retention deletes from its old end.
    INDEX archive_finished (finished_at, id),
    -- The DLQ listing and depth: unreplayed dead letters, newest first.
    INDEX archive_dead (state, replayed_by, finished_at, id),
    INDEX archive_dlq_queue (state, replayed_by, queue),
    -- Queue load counts one queue's rows finished in a window with one seek per state.
    INDEX archive_queue_state_finished (queue, state, finished_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Producer-side deduplication: who holds each (queue, key) and until when (NULL: for ever).
CREATE TABLE idempotency_keys (
    queue      VARCHAR(200) NOT NULL,
    `key`      VARCHAR(512) NOT NULL,
    job_id     CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    expires_at DOUBLE,
    PRIMARY KEY (queue, `key`),
    INDEX idempotency_keys_expiry (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Consumer-side idempotency: one row per side effect that happened, until it expires.
CREATE TABLE processed_keys (
    `key`      VARCHAR(512) NOT NULL PRIMARY KEY,
    expires_at DOUBLE       NOT NULL,
    claimed_at DOUBLE       NOT NULL,
    INDEX processed_keys_expiry (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Operator actions (replay, purge): who, when, which jobs, why.
CREATE TABLE audit (
    id      BIGINT   NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at      DOUBLE   NOT NULL,
    actor   LONGTEXT NOT NULL,
    action  LONGTEXT NOT NULL,
    reason  LONGTEXT NOT NULL,
    job_ids LONGTEXT NOT NULL,
    details LONGTEXT NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Periodic jobs. next_run_at is the compare-and-set token of schedule_fire and schedule_move.
CREATE TABLE schedules (
    name        VARCHAR(200) NOT NULL PRIMARY KEY,
    cron        LONGTEXT     NOT NULL,
    task        VARCHAR(200) NOT NULL,
    queue       VARCHAR(200) NOT NULL,
    payload     LONGTEXT     NOT NULL,
    next_run_at DOUBLE       NOT NULL,
    paused      TINYINT      NOT NULL DEFAULT 0,
    priority    INT          NOT NULL DEFAULT 0,
    last_run_at DOUBLE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Fan-out: a message published to a topic is copied to every subscribed queue whose filter matches.
CREATE TABLE subscriptions (
    topic  VARCHAR(200) NOT NULL,
    queue  VARCHAR(200) NOT NULL,
    task   VARCHAR(200) NOT NULL,
    filter LONGTEXT     NOT NULL,
    PRIMARY KEY (topic, queue)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- API tokens for the HTTP service: the secret is never stored, only its SHA-256; names stay unique
-- for ever. ``queues`` is a JSON array of queue names, NULL for every queue.
CREATE TABLE tokens (
    id          VARCHAR(64)  NOT NULL PRIMARY KEY,
    name        VARCHAR(200) NOT NULL UNIQUE,
    role        VARCHAR(16)  NOT NULL,
    queues      LONGTEXT,
    secret_hash VARCHAR(128) NOT NULL,
    created_at  DOUBLE       NOT NULL,
    expires_at  DOUBLE,
    revoked_at  DOUBLE,
    CONSTRAINT tokens_role CHECK (role IN ('producer', 'operator', 'admin'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Terminal totals per (queue, task), written with the archive rows they count.
CREATE TABLE queue_counters (
    queue     VARCHAR(200) NOT NULL,
    task      VARCHAR(200) NOT NULL,
    completed BIGINT       NOT NULL DEFAULT 0,
    dead      BIGINT       NOT NULL DEFAULT 0,
    expired   BIGINT       NOT NULL DEFAULT 0,
    cancelled BIGINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, task)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- The worker registry (heartbeats).
CREATE TABLE workers (
    id          VARCHAR(700) NOT NULL PRIMARY KEY,
    host        LONGTEXT     NOT NULL,
    pid         BIGINT       NOT NULL,
    queues      LONGTEXT     NOT NULL,
    concurrency INT          NOT NULL,
    started_at  DOUBLE       NOT NULL,
    last_seen   DOUBLE       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Alert states, one per (rule, queue); queue '' for a rule over every queue.
CREATE TABLE alerts (
    rule       VARCHAR(200) NOT NULL,
    queue      VARCHAR(200) NOT NULL,
    state      VARCHAR(12)  NOT NULL,
    since      DOUBLE       NOT NULL,
    value      DOUBLE       NOT NULL,
    threshold  DOUBLE       NOT NULL,
    message    LONGTEXT     NOT NULL,
    updated_at DOUBLE       NOT NULL,
    PRIMARY KEY (rule, queue),
    CONSTRAINT alerts_state CHECK (state IN ('firing', 'resolved'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
