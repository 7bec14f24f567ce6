-- Delivery features: effects-once keys, cron schedules, topic subscriptions, and the indexes that
-- key pruning, backpressure (queue load) and archive retention read.

-- Consumer-side idempotency: one row per side effect that happened, until it expires.
CREATE TABLE processed_keys (
    key        TEXT NOT NULL PRIMARY KEY,
    expires_at REAL NOT NULL,
    claimed_at REAL NOT NULL
);

-- Key pruning deletes expired rows oldest first without scanning live keys.
CREATE INDEX processed_keys_expiry ON processed_keys (expires_at);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at) WHERE expires_at IS NOT NULL;

-- Periodic jobs. next_run_at is the compare-and-set token of schedule_fire: a tick fires only for
-- the scheduler whose update still finds the next_run_at it read.
CREATE TABLE schedules (
    name        TEXT    NOT NULL PRIMARY KEY,
    cron        TEXT    NOT NULL,
    task        TEXT    NOT NULL,
    queue       TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    next_run_at REAL    NOT NULL,
    paused      INTEGER NOT NULL DEFAULT 0,
    priority    INTEGER NOT NULL DEFAULT 0,
    last_run_at REAL
);

-- Fan-out: a message published to a topic is copied to every subscribed queue whose filter matches.
CREATE TABLE subscriptions (
    topic  TEXT NOT NULL,
    queue  TEXT NOT NULL,
    task   TEXT NOT NULL,
    filter TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (topic, queue)
);

-- Queue load counts one queue's processing rows (pending ones it reads from jobs_ready).
CREATE INDEX jobs_processing_queue ON jobs (queue) WHERE state = 'processing';

-- One index serves both archive readers by queue: stats count (queue, state) from it alone, and
-- queue load counts a queue's rows finished in a time window with one seek per state.
DROP INDEX archive_queue_state;
CREATE INDEX archive_queue_state_finished ON archive (queue, state, finished_at);
