-- Named statements of the PostgreSQL backend, loaded by conveyor.backends._sql.load_queries.
--
-- Outcome statements also say `j.id = ANY (ids)`: it gives the scan of jobs a primary-key index
-- condition whatever join the planner picks for the unnested items.
--
-- Receipts: a row has a receipt exactly while it is processing (a CHECK constraint in 0001 holds
-- the table to it), so statements about a delivery match on (id, receipt) alone. They must not
-- also say state = 'processing': the planner would then read the partial lease index, whose
-- entries for rows finished since the last vacuum are dead, and a bitmap scan of it costs
-- O(rows finished recently) per call instead of one primary-key probe per item (measured: a
-- 500-item finish went from ~2.6 s to a few ms in a 60,000-job drain).
--
-- Conventions: a statement that returns records names its columns as the record's fields (the
-- backend maps rows by name). Parameters are psycopg named placeholders; batches travel as parallel arrays that
-- the statement unnests, so that one call is one round trip however many jobs it names. Arrays
-- are sent in binary (the b placeholders): psycopg builds a binary array many times faster than the quoted
-- text form, which dominated the cost of a 20,000-job insert. Payloads,
-- headers and results are stored as jsonb and read back as text (::text) so that the worker decodes
-- them once, in Python, and psycopg never parses them. Every insert that can make a job ready calls
-- pg_notify once per distinct queue (NOTIFY also folds duplicates within a transaction); the
-- payload of the notification is the queue name, on the one channel conveyor_jobs.

-- name: session_setup
-- What a database or role may set otherwise (ALTER DATABASE ... SET), and Conveyor reads back:
-- * times cross the seam as UTC; make the session hand them out in UTC;
-- * in ISO style, the one psycopg reads ('SQL, DMY' made every acquire fail after taking its leases);
-- * floats in full (extra_float_digits below 1 rounds them: a queue's oldest age 1749.3 s read 2000);
-- * a SQL_ASCII database stores bytes unchecked and psycopg then reads every text column as bytes
--   (a task name b'send' matches no task): Conveyor's text is UTF-8, so the session says so.
SET TIME ZONE 'UTC';
SET DateStyle = 'ISO';
SET extra_float_digits = 1;
SELECT set_config('client_encoding', 'UTF8', false) WHERE current_setting('server_encoding') = 'SQL_ASCII'

-- name: migrations_lock
-- A transaction-scoped advisory lock serialises concurrent migrators (several workers starting
-- at once); it is released by the commit, so a crashed migrator can never leave it held.
SELECT pg_advisory_xact_lock(hashtextextended('conveyor.migrate', 0))

-- name: migrations_table
-- Created under the lock above, so concurrent IF NOT EXISTS cannot race on the catalog.
CREATE TABLE IF NOT EXISTS conveyor_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migrations_applied
SELECT version FROM conveyor_schema_migrations ORDER BY version

-- name: migrations_ledger_exists
-- Whether migrate() has ever run here (readiness checks ask before the ledger exists).
SELECT to_regclass('conveyor_schema_migrations') IS NOT NULL

-- name: migrations_elsewhere
-- The other schemas of this database that hold a set of Conveyor's tables, when this connection's own
-- schema was picked by "$user" (the default search_path: a schema named after the role comes first).
SELECT n.nspname
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relname = 'conveyor_schema_migrations' AND c.relkind = 'r' AND n.nspname <> current_schema()
  AND current_schema() = current_user
  AND split_part(current_setting('search_path'), ',', 1) = '"$user"'
ORDER BY 1

-- name: database_now
-- The server's clock (not the transaction's start): workers keep time by it (Worker, clock skew).
SELECT clock_timestamp()

-- name: migrations_record
INSERT INTO conveyor_schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: archive_partitions_ensure
-- The work is in a function (migration 0001) because it needs dynamic DDL and a loop.
SELECT conveyor_archive_partitions_ensure(%(first_day)s::date, %(days)s)

-- name: keys_prune
-- Expired keys of both kinds are dead weight (an expired key is taken over on conflict anyway).
-- Deleted in one bounded batch, idempotency keys first, so the pruner never holds many row locks
-- at once; ctid lists make each DELETE a TID scan, and the outer expiry test re-checks a row that
-- a producer took over meanwhile (its new version is not expired and is left alone).
WITH idem AS (
    DELETE FROM idempotency_keys
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM idempotency_keys WHERE expires_at <= %(now)s LIMIT %(limit)s
    ))
      AND expires_at <= %(now)s
    RETURNING 1
),
processed AS (
    DELETE FROM processed_keys
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM processed_keys
        WHERE expires_at <= %(now)s
        LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM idem))
    ))
      AND expires_at <= %(now)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM idem) + (SELECT count(*) FROM processed)

-- name: processed_keys_claim
-- Claims a key unless an unexpired claim exists. A concurrent claimer of the same key waits for
-- the first one's transaction; the conflict arm then re-checks expiry on the committed row and
-- returns nothing, so exactly one of them gets the row back (True).
INSERT INTO processed_keys AS p (key, expires_at, claimed_at)
VALUES (%(key)s, %(expires_at)s, %(now)s)
ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, claimed_at = excluded.claimed_at
    WHERE p.expires_at <= %(now)s
RETURNING true

-- name: archive_partitions_old
-- Daily partitions wholly before `before` (candidates for dropping), oldest first.
SELECT c.relname::text,
       to_date(substr(c.relname, 10), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC' AS lo,
       (to_date(substr(c.relname, 10), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' AS hi
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'archive'::regclass
  AND c.relname ~ '^archive_p[0-9]{8}$'
  AND (to_date(substr(c.relname, 10), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= %(before)s
ORDER BY c.relname

-- name: archive_range_keeps
-- Does [lo, hi) hold a row still within its retention? The finished_at range prunes the scan to
-- one partition, and EXISTS stops at the first row to keep. Per-queue cutoffs travel as arrays;
-- queues not named fall back to the defaults.
WITH cut AS (
    SELECT *
    FROM unnest(%(queues)b::text[], %(befores)b::timestamptz[], %(dead_befores)b::timestamptz[])
        AS t(queue, before, dead_before)
)
SELECT EXISTS (
    SELECT 1
    FROM archive AS a
    LEFT JOIN cut AS c ON c.queue = a.queue
    WHERE a.finished_at >= %(lo)s AND a.finished_at < %(hi)s
      AND a.finished_at >= CASE WHEN a.state = 'dead'
                                THEN coalesce(c.dead_before, %(default_dead_before)s)
                                ELSE coalesce(c.before, %(default_before)s) END
)

-- name: archive_partition_drop
-- The DDL is in a function (migration 0001): it needs a dynamic table name and a lock_timeout.
SELECT conveyor_archive_partition_drop(%(part)s)

-- name: archive_prune_rows
-- Row-by-row retention, for what partition drops cannot take (the DEFAULT partition, partitions
-- that still hold rows to keep, partitions whose drop a held lock put off): a bounded batch of
-- victims by primary key. The `finished_at < max_cutoff` range lets the scan use the primary key
-- and prune partitions; without an ORDER BY the scan stops at the LIMIT (1.2M-row archive, 10,000
-- victims: 10,000 rows read). SKIP LOCKED: a row another transaction holds (an operator's session)
-- is left for a later prune instead of stalling this one, with no timeout, until that transaction
-- ends. The delete takes the victims through unnest, which the planner counts as 10 rows, so it
-- looks each one up by key (one index probe each, the other partitions pruned per probe); joined to
-- the CTE (counted as `limit` rows) it hashed the whole archive: 1.2M rows read and ~600 ms per
-- batch of 10,000 against ~75 ms now (EXPLAIN ANALYZE on this machine; see docs/decisions.md).
WITH cut AS (
    SELECT *
    FROM unnest(%(queues)b::text[], %(befores)b::timestamptz[], %(dead_befores)b::timestamptz[])
        AS t(queue, before, dead_before)
),
victims AS (
    SELECT a.finished_at, a.id
    FROM archive AS a
    LEFT JOIN cut AS c ON c.queue = a.queue
    WHERE a.finished_at < %(max_cutoff)s
      AND a.finished_at < CASE WHEN a.state = 'dead'
                               THEN coalesce(c.dead_before, %(default_dead_before)s)
                               ELSE coalesce(c.before, %(default_before)s) END
    LIMIT %(limit)s
    FOR UPDATE OF a SKIP LOCKED
)
DELETE FROM archive AS a
USING unnest(ARRAY(SELECT finished_at FROM victims), ARRAY(SELECT id FROM victims)) AS v(finished_at, id)
WHERE a.finished_at = v.finished_at AND a.id = v.id

-- name: schedules_upsert
-- Re-declaring schedules at every worker start must neither skip nor repeat a tick: an existing
-- schedule keeps paused, last_run_at and (unless its cron changed) next_run_at.
INSERT INTO schedules AS s (name, cron, task, queue, payload, next_run_at, paused, priority, last_run_at)
SELECT *
FROM unnest(
    %(names)b::text[], %(crons)b::text[], %(tasks)b::text[], %(queues)b::text[],
    %(payloads)b::jsonb[], %(next_run_ats)b::timestamptz[], %(pauseds)b::boolean[],
    %(priorities)b::integer[], %(last_run_ats)b::timestamptz[]
)
ON CONFLICT (name) DO UPDATE SET
    cron = excluded.cron,
    task = excluded.task,
    queue = excluded.queue,
    payload = excluded.payload,
    priority = excluded.priority,
    next_run_at = CASE WHEN s.cron = excluded.cron THEN s.next_run_at ELSE excluded.next_run_at END

-- name: schedules_list
SELECT name, cron, task, queue, payload::text, next_run_at, paused, priority, last_run_at
FROM schedules
ORDER BY name

-- name: schedules_update
-- NULL parameters leave their column as it is.
UPDATE schedules SET
    paused = coalesce(%(paused)s::boolean, paused),
    cron = coalesce(%(cron)s::text, cron),
    next_run_at = coalesce(%(next_run_at)s::timestamptz, next_run_at)
WHERE name = %(name)s

-- name: schedules_delete
DELETE FROM schedules WHERE name = %(name)s

-- name: schedule_fire
-- Compare-and-set on next_run_at: of several schedulers firing the same tick, the first UPDATE
-- wins; the others wait for its row lock, re-check `next_run_at = due_at` on the new version and
-- match nothing, so their INSERT has no row to copy. The job is inserted in the same statement,
-- so a tick is never marked fired without its job (nor the reverse). last_run_at is the tick the
-- job is for (after downtime the latest missed one), not the stored due_at the set compared.
-- The set also compares the definition the scheduler read (read_*): an operator's change between
-- its read and this fire that kept the next tick (a new cron with the same next tick, a new task or
-- payload) would otherwise fire a job of the old definition and store a next tick of the old cron.
-- The payload is compared as jsonb, as the scheduler read it back (payload::text).
WITH fired AS (
    UPDATE schedules SET next_run_at = %(next_run_at)s, last_run_at = %(last_run_at)s
    WHERE name = %(name)s AND NOT paused AND next_run_at = %(due_at)s
      AND cron = %(read_cron)s AND task = %(read_task)s AND queue = %(read_queue)s
      AND payload = %(read_payload)s::jsonb AND priority = %(read_priority)s
    RETURNING name
),
inserted AS (
    INSERT INTO jobs (
        id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
        max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of
    )
    SELECT %(id)s, %(queue)s, %(task)s, %(payload)s::jsonb, %(headers)s::jsonb,
           CASE WHEN %(run_at)s > %(now)s THEN 'scheduled' ELSE 'pending' END, %(priority)s,
           %(run_at)s, %(now)s, %(expires_at)s, %(max_attempts)s, %(max_deliveries)s,
           %(idempotency_key)s, %(ordering_key)s, %(replay_of)s::uuid
    FROM fired
    ON CONFLICT (id) DO NOTHING
    RETURNING queue, state
),
notified AS (
    SELECT pg_notify('conveyor_jobs', queue) FROM inserted WHERE state = 'pending'
)
SELECT (SELECT count(*) FROM fired), (SELECT count(*) FROM notified)

-- name: schedule_move
-- The same compare-and-set on next_run_at, firing nothing: a next tick stored by a clock that was
-- ahead of the scheduler's referee (see worker/scheduler.py) is moved back. It races the fires and
-- moves of the same stored tick on the row lock as schedule_fire does, so of them all exactly one
-- changes it: a tick is never both moved and fired, nor moved twice. The tick it moves to was worked
-- out from the cron read, so the definition read is compared as schedule_fire compares it.
UPDATE schedules SET next_run_at = %(next_run_at)s
WHERE name = %(name)s AND NOT paused AND next_run_at = %(due_at)s
  AND cron = %(read_cron)s AND task = %(read_task)s AND queue = %(read_queue)s
  AND payload = %(read_payload)s::jsonb AND priority = %(read_priority)s

-- name: subscriptions_upsert
INSERT INTO subscriptions AS s (topic, queue, task, filter)
SELECT * FROM unnest(%(topics)b::text[], %(queues)b::text[], %(tasks)b::text[], %(filters)b::jsonb[])
ON CONFLICT (topic, queue) DO UPDATE SET task = excluded.task, filter = excluded.filter

-- name: subscriptions_list
SELECT topic, queue, task, filter::text
FROM subscriptions
WHERE %(topic)s::text IS NULL OR topic = %(topic)s::text
ORDER BY topic, queue

-- name: subscriptions_delete
DELETE FROM subscriptions WHERE topic = %(topic)s AND queue = %(queue)s

-- name: queue_load
-- What backpressure reads on every send to a queue with a high-water mark: the live depth (the
-- jobs table is small) and the recent drain through archive_queue_finished_idx, a range scan.
SELECT
    (SELECT count(*) FROM jobs WHERE queue = %(queue)s),
    (SELECT count(*) FROM archive
     WHERE queue = %(queue)s AND finished_at >= %(since)s AND finished_at <= %(now)s)

-- name: queue_keys_held
-- Which of a send's idempotency keys are held at now (backpressure does not count their sends:
-- the insert answers the holder), through the primary key.
SELECT key FROM idempotency_keys
WHERE queue = %(queue)s AND key = ANY(%(keys)s::text[]) AND (expires_at IS NULL OR expires_at > %(now)s)

-- name: session_async_commit
-- The outcome connections' commits do not wait for the WAL flush (unless durable_acks): set here
-- rather than as a startup option, which PgBouncer refuses and which replaced the URL's own options.
SET synchronous_commit = off

-- name: session_client_check
-- Under a statement_deadline: the server gives up a statement whose client is gone within a second (a
-- connection the deadline cut), a lock wait too, rather than running it to its end with no one to read the
-- answer (an acquire so run leased jobs to no one). PostgreSQL 14 or later on a system that can tell
-- (Linux, macOS, the BSDs); elsewhere the setting is refused and the session goes without it.
DO $$BEGIN PERFORM set_config('client_connection_check_interval', '1s', false); EXCEPTION WHEN OTHERS THEN NULL; END$$

-- name: listen
-- One channel for every queue: a queue name is free text and may not fit an identifier, so it
-- travels as the notification's payload and the listener filters on it (read as UTF-8, as in
-- session_setup).
SELECT set_config('client_encoding', 'UTF8', false) WHERE current_setting('server_encoding') = 'SQL_ASCII';
LISTEN conveyor_jobs

-- name: jobs_insert_many
-- One statement for the whole batch:
-- * input: the batch as rows (WITH ORDINALITY keeps the caller's order for "first one wins").
-- * keyed: claims each idempotency key. DISTINCT ON keeps one claim per key (ON CONFLICT DO
--   UPDATE may not touch a row twice), and ordering the claims by key makes concurrent batches
--   take key locks in the same order, so they cannot deadlock. The conflict arm always updates,
--   keeping the holder while its window is open and handing the key over once it has expired:
--   a DO NOTHING (or an update with a WHERE) would not return the row a concurrent transaction
--   just committed, because this statement's snapshot cannot see it, whereas the updated row is
--   always returned in its latest version. The caller thus always learns the holder's job id.
-- * inserted: a keyed job is inserted only if it holds its key after the claim. ON CONFLICT (id)
--   makes a producer's resend of a live job id a no-op; the archive probe (archive_id_idx, one
--   probe per partition) does the same for a job that already ended, skipped for fresh ids
--   (minted for this send: they cannot be there).
-- * state: a job whose run_at is still ahead is 'scheduled' (jobs_scheduled_idx), not 'pending'
--   (jobs_ready_idx), so that acquires never walk over it (migration 0005); jobs_promote makes it
--   pending once it is due.
-- * notified: one pg_notify per distinct queue that got a ready job. A plain SELECT in WITH runs only
--   if the main query reads it, hence the count(*) the final SELECT joins to.
-- Returns the key holders (queue, key, job_id); unkeyed jobs keep their own id. Returns at least
-- one row (all NULL when there are no keys).
WITH input AS (
    SELECT *
    FROM unnest(
        %(ids)b::uuid[], %(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[],
        %(headers)b::text[], %(priorities)b::integer[], %(run_ats)b::timestamptz[],
        %(expires_ats)b::timestamptz[], %(max_attempts)b::integer[], %(max_deliveries)b::integer[],
        %(idempotency_keys)b::text[], %(ordering_keys)b::text[], %(replay_ofs)b::uuid[],
        %(dedup_untils)b::timestamptz[], %(freshes)b::boolean[]
    ) WITH ORDINALITY AS t(
        id, queue, task, payload, headers, priority, run_at, expires_at, max_attempts,
        max_deliveries, idempotency_key, ordering_key, replay_of, dedup_until, fresh, ord
    )
),
keyed AS (
    INSERT INTO idempotency_keys AS k (queue, key, job_id, expires_at)
    SELECT DISTINCT ON (i.queue, i.idempotency_key) i.queue, i.idempotency_key, i.id, i.dedup_until
    FROM input AS i
    WHERE i.idempotency_key IS NOT NULL
    ORDER BY i.queue, i.idempotency_key, i.ord
    ON CONFLICT (queue, key) DO UPDATE SET
        job_id = CASE WHEN k.expires_at <= %(now)s THEN excluded.job_id ELSE k.job_id END,
        expires_at = CASE WHEN k.expires_at <= %(now)s THEN excluded.expires_at ELSE k.expires_at END
    RETURNING k.queue, k.key, k.job_id
),
inserted AS (
    INSERT INTO jobs (
        id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
        max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of
    )
    SELECT i.id, i.queue, i.task, i.payload::jsonb, i.headers::jsonb,
           CASE WHEN i.run_at > %(now)s THEN 'scheduled' ELSE 'pending' END, i.priority, i.run_at,
           %(now)s, i.expires_at, i.max_attempts, i.max_deliveries, i.idempotency_key,
           i.ordering_key, i.replay_of
    FROM input AS i
    WHERE (i.idempotency_key IS NULL OR i.id IN (SELECT job_id FROM keyed))
      AND (i.fresh OR NOT EXISTS (SELECT 1 FROM archive AS a WHERE a.id = i.id))
    ON CONFLICT (id) DO NOTHING
    RETURNING queue, state
),
notified AS (
    SELECT pg_notify('conveyor_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE state = 'pending') AS q
)
SELECT k.queue, k.key, k.job_id
FROM (SELECT count(*) FROM notified) AS n
LEFT JOIN keyed AS k ON true

-- name: idempotency_holder_job
-- The task and payload of a key's holder, live or ended, read by a strict send
-- (JobsInsertParams.strict_keys) in its own transaction, after its rows are written: a holder
-- earlier in the same batch is then found too. payload::text is jsonb's normal form.
SELECT task, payload::text FROM jobs WHERE id = %(id)s
UNION ALL
SELECT task, payload::text FROM archive WHERE id = %(id)s

-- name: jobs_insert_many_unkeyed
-- The same insert for a batch without idempotency keys (the common bulk case). Without the
-- keyed CTE the unnested rows are read once, so they stream into the INSERT instead of being
-- materialised (a 20,000-job batch spilled a CTE to a temporary file): measured ~25%% less
-- server time. Ids that are not fresh are looked up in the archive (a resend of a job that ended
-- inserts nothing). Returns one row: the number of queues notified.
WITH inserted AS (
    INSERT INTO jobs (
        id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
        max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of
    )
    SELECT i.id, i.queue, i.task, i.payload::jsonb, i.headers::jsonb,
           CASE WHEN i.run_at > %(now)s THEN 'scheduled' ELSE 'pending' END, i.priority, i.run_at,
           %(now)s, i.expires_at, i.max_attempts, i.max_deliveries, NULL, i.ordering_key,
           i.replay_of
    FROM unnest(
        %(ids)b::uuid[], %(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[],
        %(headers)b::text[], %(priorities)b::integer[], %(run_ats)b::timestamptz[],
        %(expires_ats)b::timestamptz[], %(max_attempts)b::integer[], %(max_deliveries)b::integer[],
        %(ordering_keys)b::text[], %(replay_ofs)b::uuid[], %(freshes)b::boolean[]
    ) AS i(
        id, queue, task, payload, headers, priority, run_at, expires_at, max_attempts,
        max_deliveries, ordering_key, replay_of, fresh
    )
    WHERE i.fresh OR NOT EXISTS (SELECT 1 FROM archive AS a WHERE a.id = i.id)
    ON CONFLICT (id) DO NOTHING
    RETURNING queue, state
)
SELECT count(*)
FROM (SELECT pg_notify('conveyor_jobs', q.queue)
      FROM (SELECT DISTINCT queue FROM inserted WHERE state = 'pending') AS q) AS n

-- name: jobs_insert_one
-- One job without an idempotency key whose id is fresh (the common delay()): scalar parameters, which
-- psycopg adapts in C, where jobs_insert_many_unkeyed's twelve one-element arrays are built in Python.
-- A fresh id (minted for this send) cannot be in the archive: no probe, a plain VALUES. (One statement
-- for both, the probe behind an `OR` on the fresh flag, took 0.04-0.075 ms more per delay(), of ~0.7 ms;
-- docs/benchmarks.md, session 22.)
WITH inserted AS (
    INSERT INTO jobs (
        id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
        max_attempts, max_deliveries, ordering_key, replay_of
    )
    VALUES (
        %(id)s, %(queue)s, %(task)s, %(payload)s::jsonb, %(headers)s::jsonb,
        CASE WHEN %(run_at)s > %(now)s THEN 'scheduled' ELSE 'pending' END, %(priority)s, %(run_at)s,
        %(now)s, %(expires_at)s, %(max_attempts)s, %(max_deliveries)s, %(ordering_key)s, %(replay_of)s
    )
    ON CONFLICT (id) DO NOTHING
    RETURNING queue, state
)
SELECT count(pg_notify('conveyor_jobs', queue)) FROM inserted WHERE state = 'pending'

-- name: jobs_insert_one_resent
-- As jobs_insert_one for an id that is not fresh (a producer's resend of the same message): a job
-- already finished under that id (in the archive) is not inserted again, nor is a live one (ON CONFLICT).
WITH inserted AS (
    INSERT INTO jobs (
        id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
        max_attempts, max_deliveries, ordering_key, replay_of
    )
    SELECT
        %(id)s, %(queue)s, %(task)s, %(payload)s::jsonb, %(headers)s::jsonb,
        CASE WHEN %(run_at)s > %(now)s THEN 'scheduled' ELSE 'pending' END, %(priority)s, %(run_at)s,
        %(now)s, %(expires_at)s, %(max_attempts)s, %(max_deliveries)s, %(ordering_key)s, %(replay_of)s
    WHERE NOT EXISTS (SELECT 1 FROM archive AS a WHERE a.id = %(id)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING queue, state
)
SELECT count(pg_notify('conveyor_jobs', queue)) FROM inserted WHERE state = 'pending'

-- name: jobs_copy
-- The bulk path of jobs_insert_many: a batch of fresh ids without idempotency keys streams into jobs
-- with COPY (binary; jobs_copy_text below for smaller batches), which the server inserts while the
-- client is still sending; measured 2-3x less time than the unnested INSERT for 20,000 jobs. COPY has
-- no ON CONFLICT: a batch that resends a live job id fails with a unique violation and is inserted
-- again by jobs_insert_many_unkeyed. Fresh ids cannot be in the archive, so COPY needs no archive
-- probe. The caller writes each row's state ('scheduled' when its run_at is still ahead, as the INSERT
-- statements decide).
COPY jobs (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    max_attempts, max_deliveries, ordering_key
) FROM STDIN (FORMAT BINARY)

-- name: jobs_copy_text
-- jobs_copy in text format, for batches below a few thousand jobs: the server inserts a text COPY's
-- rows every 64 KB as they arrive, a binary one's only every 1,000 rows (see postgres/_copy.py).
COPY jobs (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    max_attempts, max_deliveries, ordering_key
) FROM STDIN

-- name: transaction_begin
-- Any statement on a connection that is not in autocommit mode opens its transaction (psycopg sends
-- BEGIN first); this one does nothing else.
SELECT 1

-- name: transaction_open
-- On a pooled (autocommit) connection, the COPY path's transaction of its own: opened explicitly so
-- that its COMMIT can go with the notifications (jobs_notify_queue) as one query.
BEGIN

-- name: lock_timeout_set
-- A bounded insert's lock wait (jobs_insert_many with a lock_wait), for its transaction only: sent in
-- one pipeline with the insert, the two are one implicit transaction.
SELECT set_config('lock_timeout', %(wait)s, true)

-- name: transaction_commit
-- Appended to the COPY path's notifications on a pooled connection (see transaction_open).
COMMIT

-- name: jobs_notify_queue
-- After a jobs_copy, in its transaction: one per distinct queue ({queue}: the name as a quoted literal).
-- A utility statement, nothing to plan; without parameters psycopg sends the batch's notifications
-- (and, on a pooled connection, its COMMIT) as one simple query, that is in one round trip.
NOTIFY conveyor_jobs, {queue}

-- name: jobs_promote
-- Makes the scheduled jobs of one queue that are due pending, the earliest first, at most `limit` of
-- them, and notifies the queue if any moved, so that idle workers acquire them. A range scan of
-- jobs_scheduled_idx (queue, run_at): one index probe when nothing is due, whatever is scheduled
-- later. SKIP LOCKED lets two promoters share a backlog. Returns how many moved and when the queue's
-- next scheduled job is due (NULL: none), which tells the caller when to promote again.
WITH due AS MATERIALIZED (
    SELECT ctid
    FROM jobs
    WHERE queue = %(queue)s AND state = 'scheduled' AND run_at <= %(now)s
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
promoted AS (
    UPDATE jobs SET state = 'pending'
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM due))
    RETURNING queue
),
notified AS (
    SELECT pg_notify('conveyor_jobs', q.queue) FROM (SELECT DISTINCT queue FROM promoted) AS q
)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       (SELECT count(*) FROM notified) AS notified,
       (SELECT min(run_at) FROM jobs
        WHERE queue = %(queue)s AND state = 'scheduled' AND run_at > %(now)s) AS next_run_at

-- name: jobs_acquire
-- One round trip. The MATERIALIZED CTE is a fence: it picks and locks at most `limit` rows, in
-- delivery order, skipping rows other workers hold (SKIP LOCKED), and the UPDATE then touches
-- exactly those row versions by their ctid (a TID scan): `ctid = ANY (ARRAY(...))` pins that plan,
-- where a join to the CTE lets the planner pick a hash join over a sequential scan of the whole
-- table, and it saves a primary-key descent per row (measured: 150 -> 20 buffers for 20 rows with
-- 1M rows in jobs). The ctids are stable: the rows stay locked by this statement until it
-- commits. (Were one ever stale, the UPDATE would re-check it, find no match and skip the row,
-- which then stays pending: never a double delivery.) The planner walks jobs_ready_idx (queue,
-- priority DESC, run_at, id) WHERE state = 'pending', so the ORDER BY ... LIMIT stops after
-- `limit` hits, or at the end of the queue's ready jobs: jobs scheduled for later are not in that
-- index (they are 'scheduled' until jobs_promote makes them pending), so an acquire that finds
-- fewer jobs than it asked for costs no more than one that finds them all. (Before migration 0005
-- it walked every scheduled job of the queue: run_at is a filter here, not a bound, since priority
-- comes first.) The run_at test still holds back a row an older release wrote as pending for later.
-- Per-key FIFO: a keyed job is eligible only as the head of its key (no live row of the key
-- with a smaller id) and only while no job of its key is in flight. The second test also covers
-- the rare case of a smaller id committed after a larger one was already handed out. Both are
-- single probes into small partial indexes. RETURNING order is unspecified, hence the final sort.
-- A lease is not a delivery: deliveries is counted when the handler starts (with its outcome, or by
-- jobs_start_many), so jobs a worker only prefetched are not charged if it dies.
WITH picked AS MATERIALIZED (
    SELECT j.ctid
    FROM jobs AS j
    WHERE j.queue = %(queue)s
      AND j.state = 'pending'
      AND j.run_at <= %(now)s
      AND (j.ordering_key IS NULL OR (
              NOT EXISTS (
                  SELECT 1 FROM jobs AS h
                  WHERE h.queue = j.queue AND h.ordering_key = j.ordering_key AND h.id < j.id)
          AND NOT EXISTS (
                  SELECT 1 FROM jobs AS f
                  WHERE f.queue = j.queue AND f.ordering_key = j.ordering_key
                    AND f.state = 'processing')))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
leased AS (
    UPDATE jobs AS j SET
        state = 'processing',
        receipt = gen_random_uuid(),
        lease_expires_at = %(now)s + make_interval(secs => %(visibility_timeout)s),
        worker_id = %(worker_id)s,
        started_at = %(now)s,
        first_started_at = coalesce(j.first_started_at, %(now)s)
    WHERE j.ctid = ANY (ARRAY(SELECT ctid FROM picked))
    RETURNING j.id, j.queue, j.task, j.payload::text AS payload, j.headers::text AS headers,
              j.priority, j.run_at, j.enqueued_at, j.expires_at, j.attempts, j.deliveries,
              j.max_attempts, j.max_deliveries, j.idempotency_key, j.ordering_key,
              j.receipt::text AS receipt, j.lease_expires_at, j.rescues
)
-- A time no datetime holds (infinity, a year before 1 or after 9999: raw SQL wrote it) is handed out as the first or
-- last one here, in the statement: the worker's own connections read times with psycopg's C loader (the clamping
-- loader of _times costs ~0.6 us a time in Python, four times a job), and psycopg refused to read it, after the
-- leases were taken. The session's time zone is UTC (session_setup). A CASE, not LEAST/GREATEST: those skip a NULL
-- (an expires_at of none read as the year 9999).
SELECT id, queue, task, payload, headers, priority,
       CASE WHEN run_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
            WHEN run_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
            ELSE run_at END::timestamptz AS run_at,
       CASE WHEN enqueued_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
            WHEN enqueued_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
            ELSE enqueued_at END::timestamptz AS enqueued_at,
       CASE WHEN expires_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
            WHEN expires_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
            ELSE expires_at END::timestamptz AS expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, receipt,
       lease_expires_at, rescues
FROM leased ORDER BY priority DESC, leased.run_at, id

-- name: jobs_start_many
-- Counts deliveries as started before their outcome: for a suspect job just before its handler runs
-- (poison protection reads the count, so a handler that kills its worker has been counted), and for
-- jobs running long, from the heartbeat. Matched on (id, receipt) like every outcome; returns the ids
-- that still held their lease.
UPDATE jobs AS j SET
    deliveries = j.deliveries + 1
FROM unnest(%(ids)b::uuid[], %(receipts)b::uuid[]) AS i(id, receipt)
WHERE j.id = ANY (%(ids)b::uuid[]) AND j.id = i.id AND j.receipt = i.receipt
RETURNING j.id, j.receipt

-- name: jobs_start_many_skip_locked
-- The heartbeat's counts (flushed by the completer ahead of the outcomes): a row another transaction
-- holds locked is skipped rather than waited for, which would hold up every ack behind it; it is
-- not counted now and not returned, and the heartbeat asks again at its next beat.
WITH free AS MATERIALIZED (
    SELECT j.id
    FROM jobs AS j
    WHERE j.id = ANY (%(ids)b::uuid[])
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j SET
    deliveries = j.deliveries + 1
FROM unnest(%(ids)b::uuid[], %(receipts)b::uuid[]) AS i(id, receipt)
WHERE j.id = ANY (ARRAY(SELECT id FROM free)) AND j.id = i.id AND j.receipt = i.receipt
RETURNING j.id, j.receipt

-- name: jobs_finish_many
-- Ends deliveries: the DELETE and the archive INSERT are one statement, so a job is never in
-- both tables nor in neither. The receipt in the join fences stale workers: a delivery whose
-- lease was rescued and handed out again has a new receipt, so its late outcome matches nothing.
-- When the item carries no error the job keeps the error of its last failed attempt. The lease
-- ends with the delivery: an archived row has no lease_expires_at (as on every engine).
-- The counted CTE adds the outcomes to queue_counters in the same statement (so the totals commit
-- with the archive rows, exact after a crash), on this connection's stripe, in (queue, task) order
-- so that two flushes naming the same counters lock them in the same order and cannot deadlock.
-- The notified CTE wakes the queues' idle workers when a job with an ordering key ends: the next
-- job of its key becomes ready then, and nothing else would tell them before their next poll (a
-- plain SELECT in WITH runs only if the main query reads it, hence the join to its count).
-- Returns the number of rows archived.
-- A column whose every item has its default comes as NULL (its array would cost the worker more to
-- send than the rest of the outcome: _args.finish_args); unnest pads a NULL array with NULLs, read
-- here as that default.
WITH items AS (
    SELECT t.id, t.receipt, coalesce(t.state, 'completed') AS state, t.result, t.reason, t.error_type,
           t.error_message, t.traceback, coalesce(t.ran, true) AS ran, coalesce(t.counted, false) AS counted
    FROM unnest(
        %(ids)b::uuid[], %(receipts)b::uuid[], %(states)b::text[], %(results)b::text[],
        %(reasons)b::text[], %(error_types)b::text[], %(error_messages)b::text[],
        %(tracebacks)b::text[], %(ran)b::boolean[], %(counted)b::boolean[]
    ) AS t(id, receipt, state, result, reason, error_type, error_message, traceback, ran, counted)
),
done AS (
    DELETE FROM jobs AS j
    USING items AS i
    WHERE j.id = ANY (%(ids)b::uuid[]) AND j.id = i.id AND j.receipt = i.receipt
    RETURNING j.*, i.state AS final_state, i.result AS final_result, i.reason AS final_reason,
              i.error_type AS final_error_type, i.error_message AS final_error_message,
              i.traceback AS final_traceback, i.ran AS ran, i.counted AS counted
),
counted AS (
    INSERT INTO queue_counters AS c (queue, task, shard, completed, dead, expired, cancelled)
    SELECT d.queue, d.task, (pg_backend_pid() %% 8)::smallint,
           count(*) FILTER (WHERE d.final_state = 'completed'), count(*) FILTER (WHERE d.final_state = 'dead'),
           count(*) FILTER (WHERE d.final_state = 'expired'), count(*) FILTER (WHERE d.final_state = 'cancelled')
    FROM done AS d
    GROUP BY d.queue, d.task
    ORDER BY d.queue, d.task
    ON CONFLICT (queue, task, shard) DO UPDATE SET
        completed = c.completed + excluded.completed, dead = c.dead + excluded.dead,
        expired = c.expired + excluded.expired, cancelled = c.cancelled + excluded.cancelled
),
notified AS (
    SELECT pg_notify('conveyor_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM done WHERE ordering_key IS NOT NULL) AS q
)
INSERT INTO archive (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of,
    first_started_at, started_at, lease_expires_at, worker_id, error_type, error_message,
    traceback, finished_at, result, reason, rescues
)
SELECT d.id, d.queue, d.task, d.payload, d.headers, d.final_state, d.priority, d.run_at,
       d.enqueued_at, d.expires_at, d.attempts + CASE WHEN d.ran THEN 1 ELSE 0 END,
       d.deliveries + CASE WHEN d.ran AND NOT d.counted THEN 1 ELSE 0 END,
       d.max_attempts, d.max_deliveries, d.idempotency_key, d.ordering_key, d.replay_of,
       d.first_started_at, d.started_at, NULL, d.worker_id,
       CASE WHEN d.final_error_type IS NULL THEN d.error_type ELSE d.final_error_type END,
       CASE WHEN d.final_error_type IS NULL THEN d.error_message ELSE d.final_error_message END,
       CASE WHEN d.final_error_type IS NULL THEN d.traceback ELSE d.final_traceback END,
       %(now)s, d.final_result::jsonb, d.final_reason, d.rescues
FROM done AS d, (SELECT count(*) FROM notified) AS n

-- name: jobs_retry_many
-- Back to pending at each item's run_at (scheduled while that is ahead: see jobs_promote) with the
-- attempt counted and its error kept; receipt and lease are cleared so the old delivery can no longer
-- act. worker_id (like started_at) stays: it names the worker of the last delivery until the next
-- one, as on every engine. A retry due at once (run_at <= now) notifies its queue so an idle worker
-- picks it up without polling. Returns the counts, then the queues that got a scheduled retry with
-- the earliest run_at of each (the backend promotes them when due).
WITH items AS (
    SELECT *
    FROM unnest(
        %(ids)b::uuid[], %(receipts)b::uuid[], %(run_ats)b::timestamptz[],
        %(error_types)b::text[], %(error_messages)b::text[], %(tracebacks)b::text[],
        %(counted)b::boolean[]
    ) AS t(id, receipt, run_at, error_type, error_message, traceback, counted)
),
retried AS (
    UPDATE jobs AS j SET
        state = CASE WHEN i.run_at > %(now)s THEN 'scheduled' ELSE 'pending' END,
        run_at = i.run_at,
        attempts = j.attempts + 1,
        deliveries = j.deliveries + CASE WHEN i.counted THEN 0 ELSE 1 END,
        error_type = i.error_type,
        error_message = i.error_message,
        traceback = i.traceback,
        receipt = NULL,
        lease_expires_at = NULL
    FROM items AS i
    WHERE j.id = ANY (%(ids)b::uuid[]) AND j.id = i.id AND j.receipt = i.receipt
    RETURNING j.queue, j.run_at
),
notified AS (
    SELECT pg_notify('conveyor_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM retried WHERE run_at <= %(now)s) AS q
),
later AS (
    SELECT queue, min(run_at) AS run_at FROM retried WHERE run_at > %(now)s GROUP BY queue
)
SELECT (SELECT count(*) FROM retried), (SELECT count(*) FROM notified),
       (SELECT array_agg(queue ORDER BY queue) FROM later), (SELECT array_agg(run_at ORDER BY queue) FROM later)

-- name: jobs_release_many
-- Hands leased jobs that never started back (graceful shutdown): a lease is not a delivery, so
-- deliveries stays, and a job never started before is again one that never started. Notifies,
-- because the jobs are ready again at once and another worker may be idle.
WITH items AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(receipts)b::uuid[]) AS t(id, receipt)
),
released AS (
    UPDATE jobs AS j SET
        state = 'pending',
        first_started_at = CASE WHEN j.deliveries = 0 THEN NULL ELSE j.first_started_at END,
        started_at = CASE WHEN j.deliveries = 0 THEN NULL ELSE j.started_at END,
        receipt = NULL,
        lease_expires_at = NULL,
        worker_id = NULL
    FROM items AS i
    WHERE j.id = ANY (%(ids)b::uuid[]) AND j.id = i.id AND j.receipt = i.receipt
    RETURNING j.queue
),
notified AS (
    SELECT pg_notify('conveyor_jobs', q.queue) FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT (SELECT count(*) FROM released), (SELECT count(*) FROM notified)

-- name: leases_extend_many
-- Heartbeat for many deliveries at once; only rows still held under the same receipt move. Returns
-- the deliveries extended, in no particular order (the caller puts them in its own).
UPDATE jobs AS j SET
    lease_expires_at = %(now)s + make_interval(secs => %(visibility_timeout)s)
FROM unnest(%(ids)b::uuid[], %(receipts)b::uuid[]) AS i(id, receipt)
WHERE j.id = ANY (%(ids)b::uuid[]) AND j.id = i.id AND j.receipt = i.receipt
RETURNING j.id, j.receipt

-- name: leases_extend_many_skip_locked
-- The heartbeat's form: a row another transaction holds locked (an operator's open transaction) is
-- not waited for, which would hold up every other lease of the batch until they expired too. The
-- held CTE reads the deliveries still held from the statement's snapshot, without locking; free
-- locks those it can (SKIP LOCKED) and the UPDATE extends them, re-checking the receipt on the row
-- version it locked (a rescue committed meanwhile: not extended). Every held delivery is returned,
-- extended or skipped this time; a skipped one is extended at the next beat, or found lost then.
WITH held AS MATERIALIZED (
    SELECT j.id, j.receipt
    FROM jobs AS j, unnest(%(ids)b::uuid[], %(receipts)b::uuid[]) AS i(id, receipt)
    WHERE j.id = ANY (%(ids)b::uuid[]) AND j.id = i.id AND j.receipt = i.receipt
),
free AS MATERIALIZED (
    SELECT j.id
    FROM jobs AS j
    WHERE j.id = ANY (ARRAY(SELECT id FROM held))
    FOR UPDATE SKIP LOCKED
),
extended AS (
    UPDATE jobs AS j SET
        lease_expires_at = %(now)s + make_interval(secs => %(visibility_timeout)s)
    FROM held AS h
    WHERE j.id = ANY (ARRAY(SELECT id FROM free)) AND j.id = h.id AND j.receipt = h.receipt
    RETURNING j.id
)
SELECT h.id, h.receipt FROM held AS h
WHERE h.id IN (SELECT id FROM extended) OR h.id NOT IN (SELECT id FROM free)

-- name: jobs_rescue_expired
-- Expired leases back to pending, oldest first, in bounded batches. SKIP LOCKED keeps two
-- rescuers (or a rescuer and a finishing worker) from waiting on each other; a row whose lease
-- was extended meanwhile fails the re-checked WHERE and is left alone. deliveries is kept (a lease
-- is not a delivery); rescues + 1 makes the job a suspect, whose starts are counted before they run.
-- worker_id stays: it names the worker that lost the lease (the worker of the last delivery). A leased
-- row without a lease end (only raw SQL makes one) has no lease to wait for, and stayed processing for
-- ever: unleased rescues it too. It is a query of its own because an OR of the two conditions made
-- the partial index a filter over every leased row (2,000 in flight: 3 ms a pass) instead of a range.
WITH expired AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE state = 'processing' AND lease_expires_at < %(now)s
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
unleased AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE state = 'processing' AND lease_expires_at IS NULL
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
rescued AS (
    UPDATE jobs AS j SET
        state = 'pending',
        receipt = NULL,
        lease_expires_at = NULL,
        rescues = j.rescues + 1
    WHERE j.id = ANY (ARRAY(SELECT id FROM expired UNION ALL SELECT id FROM unleased))
    RETURNING j.queue
),
notified AS (
    SELECT pg_notify('conveyor_jobs', q.queue) FROM (SELECT DISTINCT queue FROM rescued) AS q
)
SELECT (SELECT count(*) FROM rescued), (SELECT count(*) FROM notified)

-- name: job_get
-- Live rows first; an archived row is found through archive_id_idx in each partition. A scheduled
-- row is a pending job (the state only says which index holds it: migration 0005).
(
    SELECT id, queue, task, payload::text, headers::text,
           CASE state WHEN 'scheduled' THEN 'pending' ELSE state END AS state, priority, run_at, enqueued_at,
           expires_at, attempts, deliveries, max_attempts, max_deliveries, idempotency_key,
           ordering_key, replay_of, first_started_at, started_at, lease_expires_at, worker_id,
           error_type, error_message, traceback, NULL::timestamptz AS finished_at, NULL::text AS result,
           NULL::text AS reason, NULL::uuid AS replayed_by, rescues
    FROM jobs
    WHERE id = %(id)s
)
UNION ALL
(
    SELECT id, queue, task, payload::text, headers::text, state, priority, run_at, enqueued_at,
           expires_at, attempts, deliveries, max_attempts, max_deliveries, idempotency_key,
           ordering_key, replay_of, first_started_at, started_at, lease_expires_at, worker_id,
           error_type, error_message, traceback, finished_at, result::text, reason, replayed_by, rescues
    FROM archive
    WHERE id = %(id)s
    ORDER BY finished_at DESC
)
LIMIT 1

-- name: jobs_list
-- Keyset pagination on the primary key; NULL filters mean "any". A scheduled row is a pending job.
SELECT id, queue, task, payload::text, headers::text,
       CASE state WHEN 'scheduled' THEN 'pending' ELSE state END AS state, priority, run_at, enqueued_at,
       expires_at, attempts, deliveries, max_attempts, max_deliveries, idempotency_key,
       ordering_key, replay_of, first_started_at, started_at, lease_expires_at, worker_id,
       error_type, error_message, traceback, NULL::timestamptz AS finished_at, NULL::text AS result,
       NULL::text AS reason, NULL::uuid AS replayed_by, rescues
FROM jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
ORDER BY id
LIMIT %(limit)s

-- name: queues_stats
-- Live counts from the small jobs table (pending and scheduled by run_at against now, whichever
-- index holds the row: a scheduled job that came due is ready even before jobs_promote moves it);
-- terminal totals from queue_counters (a few rows per queue, whatever the archive holds); the DLQ
-- depth from archive_dlq_queue_idx, which holds unreplayed dead letters only. Nothing here reads the
-- rest of the archive, so the cost does not grow with it. The oldest ready time is taken as at least
-- the year 1, as the rows are read (postgres/_times.py): a run_at of -infinity (raw SQL) failed the whole
-- statement ("cannot subtract infinite timestamps").
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE state <> 'processing' AND run_at <= %(now)s) AS pending,
           count(*) FILTER (WHERE state <> 'processing' AND run_at > %(now)s) AS scheduled,
           count(*) FILTER (WHERE state = 'processing') AS processing,
           min(greatest(run_at, '0001-01-01 00:00:00+00')) FILTER (WHERE state <> 'processing' AND run_at <= %(now)s)
               AS oldest_ready
    FROM jobs
    GROUP BY queue
),
totals AS (
    SELECT queue, sum(completed)::bigint AS completed, sum(dead)::bigint AS dead_total,
           sum(expired)::bigint AS expired, sum(cancelled)::bigint AS cancelled
    FROM queue_counters
    GROUP BY queue
),
dlq AS (
    SELECT queue, count(*) AS dead
    FROM archive
    WHERE state = 'dead' AND replayed_by IS NULL
    GROUP BY queue
),
names AS (
    SELECT queue FROM live UNION SELECT queue FROM totals UNION SELECT queue FROM dlq
)
SELECT n.queue,
       coalesce(l.pending, 0) AS pending, coalesce(l.scheduled, 0) AS scheduled,
       coalesce(l.processing, 0) AS processing, coalesce(t.completed, 0) AS completed,
       coalesce(d.dead, 0) AS dead, coalesce(t.expired, 0) AS expired,
       coalesce(t.cancelled, 0) AS cancelled,
       extract(epoch FROM (%(now)s - l.oldest_ready))::float8 AS oldest_pending_age,
       coalesce(t.dead_total, 0) AS dead_total,
       coalesce(l.pending + l.scheduled + l.processing, 0)
           + coalesce(t.completed + t.dead_total + t.expired + t.cancelled, 0) AS enqueued
FROM names AS n
LEFT JOIN live AS l ON l.queue = n.queue
LEFT JOIN totals AS t ON t.queue = n.queue
LEFT JOIN dlq AS d ON d.queue = n.queue
ORDER BY 1

-- name: dead_list
-- The DLQ, newest first, through the partial index of unreplayed dead letters.
SELECT id, queue, task, payload::text, headers::text, state, priority, run_at, enqueued_at,
       expires_at, attempts, deliveries, max_attempts, max_deliveries, idempotency_key,
       ordering_key, replay_of, first_started_at, started_at, lease_expires_at, worker_id,
       error_type, error_message, traceback, finished_at, result::text, reason, replayed_by, rescues
FROM archive
WHERE state = 'dead' AND replayed_by IS NULL
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(error_type)s::text IS NULL OR error_type = %(error_type)s::text)
  AND (%(before_at)s::timestamptz IS NULL OR (finished_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s

-- name: dead_replay_many
-- One transaction for the whole replay: mark the dead rows (replayed_by), insert their new jobs,
-- hand their idempotency keys to them, write one audit row, notify. The marking UPDATE re-checks
-- replayed_by IS NULL on the latest row version, so two operators replaying the same letter at once
-- replay it once. Returns the (dead id, new id) pairs replayed; at least one row (NULLs when nothing
-- was replayed).
-- * rekeyed: a dead letter that still holds its key inside the dedup window gives it to its replay,
--   so that a producer's resend during the window answers the live replay, not the dead letter (a key
--   another job took after the window is left alone; the window's end does not move). The keys are
--   locked in key order, as jobs_insert_many claims them, so a replay and a send cannot deadlock; a
--   data-modifying CTE runs to completion though nothing reads it.
WITH pairs AS (
    SELECT * FROM unnest(%(dead_ids)b::uuid[], %(new_ids)b::uuid[]) AS t(dead_id, new_id)
),
marked AS (
    UPDATE archive AS a SET replayed_by = p.new_id
    FROM pairs AS p
    WHERE a.id = p.dead_id AND a.state = 'dead' AND a.replayed_by IS NULL
    RETURNING a.id AS dead_id, p.new_id, a.queue, a.task, a.payload, a.headers, a.priority,
              a.max_attempts, a.max_deliveries, a.idempotency_key, a.ordering_key
),
replayed AS (
    INSERT INTO jobs (
        id, queue, task, payload, headers, state, priority, run_at, enqueued_at, max_attempts,
        max_deliveries, idempotency_key, ordering_key, replay_of
    )
    SELECT m.new_id, m.queue, m.task, m.payload, m.headers, 'pending', m.priority, %(now)s, %(now)s,
           m.max_attempts, m.max_deliveries, m.idempotency_key, m.ordering_key, m.dead_id
    FROM marked AS m
    RETURNING replay_of AS dead_id, id AS new_id, queue
),
rekeyed AS (
    UPDATE idempotency_keys AS k SET job_id = held.new_id
    FROM (
        SELECT h.queue, h.key, m.new_id
        FROM marked AS m
        JOIN idempotency_keys AS h
          ON h.queue = m.queue AND h.key = m.idempotency_key AND h.job_id = m.dead_id
        WHERE h.expires_at IS NULL OR h.expires_at > %(now)s
        ORDER BY h.queue, h.key
        FOR UPDATE OF h
    ) AS held
    WHERE k.queue = held.queue AND k.key = held.key
),
audited AS (
    INSERT INTO audit (at, actor, action, reason, job_ids, details)
    SELECT %(now)s, %(actor)s, 'replay', %(reason)s,
           coalesce(array_agg(r.dead_id ORDER BY r.dead_id), '{}'),
           jsonb_build_object(
               'requested', cardinality(%(dead_ids)b::uuid[]),
               'replays', coalesce(jsonb_agg(jsonb_build_array(r.dead_id, r.new_id)), '[]'::jsonb))
    FROM replayed AS r
),
notified AS (
    SELECT pg_notify('conveyor_jobs', q.queue) FROM (SELECT DISTINCT queue FROM replayed) AS q
)
SELECT r.dead_id, r.new_id
FROM (SELECT count(*) FROM notified) AS n
LEFT JOIN replayed AS r ON true

-- name: dead_purge_many
-- Deletes dead letters (replayed or not) for good and writes one audit row naming them.
WITH purged AS (
    DELETE FROM archive
    WHERE id = ANY (%(ids)b::uuid[]) AND state = 'dead'
    RETURNING id
),
audited AS (
    INSERT INTO audit (at, actor, action, reason, job_ids, details)
    SELECT %(now)s, %(actor)s, 'purge', %(reason)s,
           coalesce(array_agg(p.id ORDER BY p.id), '{}'),
           jsonb_build_object('requested', cardinality(%(ids)b::uuid[]), 'purged', count(*))
    FROM purged AS p
)
SELECT count(*) FROM purged

-- name: audit_insert
-- An operator action that changed no job row itself (replay and purge write theirs in their own
-- statement).
INSERT INTO audit (at, actor, action, reason, job_ids, details)
VALUES (%(now)s, %(actor)s, %(action)s, %(reason)s, %(job_ids)s::uuid[], %(details)s::jsonb)

-- name: audit_list
SELECT id, at, actor, action, reason, job_ids, details::text
FROM audit
WHERE %(job_id)s::uuid IS NULL OR %(job_id)s::uuid = ANY (job_ids)
ORDER BY id DESC
LIMIT %(limit)s

-- name: archive_read
-- Incremental export: a row comparison on the primary key (finished_at, id) is one index range
-- scan per partition, and partitions wholly before the watermark are pruned at execution time.
SELECT id, queue, task, payload::text, headers::text, state, priority, run_at, enqueued_at,
       expires_at, attempts, deliveries, max_attempts, max_deliveries, idempotency_key,
       ordering_key, replay_of, first_started_at, started_at, lease_expires_at, worker_id,
       error_type, error_message, traceback, finished_at, result::text, reason, replayed_by, rescues
FROM archive
WHERE (finished_at, id) > (coalesce(%(after_at)s::timestamptz, '-infinity'),
                           coalesce(%(after_id)s::uuid, '00000000-0000-0000-0000-000000000000'))
ORDER BY finished_at, id
LIMIT %(limit)s

-- name: tokens_insert
-- A taken name or id inserts nothing (RETURNING then yields no row): names are unique for ever.
INSERT INTO tokens (id, name, role, queues, secret_hash, created_at, expires_at, revoked_at)
VALUES (%(id)s, %(name)s, %(role)s, %(queues)s, %(secret_hash)s, %(created_at)s, %(expires_at)s, NULL)
ON CONFLICT DO NOTHING
RETURNING id

-- name: token_get
-- One primary-key probe per request that the service's token cache has not seen lately. An expiry past Python's
-- last datetime (the year 10000: a token made before create_token refused it) reads as that last instant, not as
-- a failure of every read of the table.
SELECT id, name, role, queues, secret_hash, created_at,
       LEAST(expires_at, '9999-12-31 23:59:59.999999+00'::timestamptz), revoked_at
FROM tokens
WHERE id = %(id)s

-- name: tokens_list
-- The expiry as token_get reads it.
SELECT id, name, role, queues, secret_hash, created_at,
       LEAST(expires_at, '9999-12-31 23:59:59.999999+00'::timestamptz), revoked_at
FROM tokens
ORDER BY name

-- name: tokens_revoke
UPDATE tokens SET revoked_at = %(now)s
WHERE name = %(name)s AND revoked_at IS NULL

-- name: task_totals
-- Terminal totals per (queue, task): the stripes of queue_counters summed.
SELECT queue, task, sum(completed)::bigint AS completed, sum(dead)::bigint AS dead,
       sum(expired)::bigint AS expired, sum(cancelled)::bigint AS cancelled
FROM queue_counters
WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text
GROUP BY queue, task
ORDER BY queue, task

-- name: database_health
-- The oldest open transaction that holds back vacuum here: one in this database (vacuum of an
-- ordinary table only waits for those) that holds a snapshot or a transaction id. A READ COMMITTED
-- session idle in a transaction that only read holds neither and is left out; a pg_dump, a
-- REPEATABLE READ report, or a writer left open is in. pg_stat_activity shows other roles'
-- sessions to superusers and members of pg_read_all_stats. Dead tuples: the statistics collector's
-- count for the jobs table.
SELECT coalesce(greatest(0, extract(epoch FROM (%(now)s - (
           SELECT min(xact_start) FROM pg_stat_activity
           WHERE datname = current_database() AND pid <> pg_backend_pid()
             AND xact_start IS NOT NULL AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
       )))), 0)::float8 AS oldest_transaction_age,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass) AS jobs_dead_tuples

-- name: workers_beat
-- One row per worker: inserted at its first heartbeat, then last_seen, queues and concurrency move.
INSERT INTO workers AS w (id, host, pid, queues, concurrency, started_at, last_seen)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(started_at)s, %(now)s)
ON CONFLICT (id) DO UPDATE SET
    last_seen = greatest(w.last_seen, excluded.last_seen), queues = excluded.queues,
    concurrency = excluded.concurrency

-- name: workers_remove
DELETE FROM workers WHERE id = %(id)s

-- name: workers_list
-- Each worker with the jobs it holds leases on: its processing rows (jobs_lease_idx covers them;
-- the jobs table holds live rows only, so this reads no history).
SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_seen,
       coalesce(
           (SELECT array_agg(j.id ORDER BY j.id) FROM jobs AS j
            WHERE j.state = 'processing' AND j.worker_id = w.id),
           '{}'::uuid[]
       ) AS in_flight
FROM workers AS w
WHERE %(seen_after)s::timestamptz IS NULL OR w.last_seen >= %(seen_after)s::timestamptz
ORDER BY w.id

-- name: jobs_vacuum
-- Not a transaction's statement (the pool's connections are in autocommit), never prepared. SKIP_LOCKED:
-- when another worker (or autovacuum) is vacuuming the table already, this returns at once.
VACUUM (SKIP_LOCKED) jobs

-- name: jobs_vacuum_bound
-- The longest a worker's vacuum may run (a table that takes longer is left to autovacuum): a worker
-- stopping meanwhile waits for it.
SET statement_timeout = '10s'

-- name: jobs_vacuum_unbound
RESET statement_timeout

-- name: workers_prune
DELETE FROM workers WHERE last_seen < %(before)s

-- name: alerts_list
SELECT rule, queue, state, since, value, threshold, message FROM alerts ORDER BY rule, queue

-- name: alerts_change
-- The compare-and-set of a state change: a concurrent evaluator making the same change waits for
-- this row lock, re-checks `state <> new` on the committed version, matches nothing, and so does
-- not notify a second time.
UPDATE alerts SET state = %(state)s, since = %(since)s, value = %(value)s, threshold = %(threshold)s,
                  message = %(message)s, updated_at = %(now)s
WHERE rule = %(rule)s AND queue = %(queue)s AND state <> %(state)s
RETURNING rule

-- name: alerts_fire_new
-- The first firing of an alert: of concurrent evaluators, the one whose row is inserted notifies.
INSERT INTO alerts (rule, queue, state, since, value, threshold, message, updated_at)
VALUES (%(rule)s, %(queue)s, %(state)s, %(since)s, %(value)s, %(threshold)s, %(message)s, %(now)s)
ON CONFLICT (rule, queue) DO NOTHING
RETURNING rule

-- name: alerts_refresh
-- No state change: the latest value (an alert that keeps firing shows how bad it is now).
UPDATE alerts SET value = %(value)s, threshold = %(threshold)s, message = %(message)s, updated_at = %(now)s
WHERE rule = %(rule)s AND queue = %(queue)s AND state = %(state)s
