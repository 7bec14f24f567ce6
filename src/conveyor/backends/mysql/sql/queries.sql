-- Named statements of the MySQL/MariaDB backend, loaded by conveyor.backends._sql.
--
-- Conventions: times are DOUBLE unix seconds; parameters are PyMySQL's %(name)s (so a literal percent
-- sign is written twice). A batch names its items as one JSON array read with JSON_TABLE, so that it
-- is one statement however many jobs it names. Neither engine has UPDATE ... RETURNING: where a
-- caller needs the rows an update changed, it first locks and reads them (SELECT ... FOR UPDATE) in
-- the same transaction, then updates exactly those. Every transaction runs at READ COMMITTED: a
-- locking read sees the latest committed row, and InnoDB takes no gap locks that would make two
-- producers' inserts wait for each other. A JSON_TABLE text column holding names, keys, results or
-- errors says CHARACTER SET utf8mb4: undeclared, it takes the database's default character set, which
-- in an application's own database may be latin1 or utf8mb3, and an emoji then became '?' without an
-- error (the tables are utf8mb4 whatever the database's default).

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(200) NOT NULL,
    applied_at DOUBLE       NOT NULL
) ENGINE = InnoDB

-- name: migrations_applied
SELECT version FROM schema_migrations ORDER BY version

-- name: migrations_ledger_exists
SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'schema_migrations'

-- name: migrations_record
INSERT INTO schema_migrations (version, name, applied_at) VALUES (%(version)s, %(name)s, %(now)s)

-- name: jobs_insert
-- Many rows per statement: PyMySQL's executemany folds the VALUES lists into one INSERT up to its
-- statement size, but only when the list holds placeholders alone (with a literal 0 in it, it sent
-- one statement per row: 8,500 jobs/s against 60,000 folded), so attempts and deliveries take
-- their defaults. A job id is accepted once: a resend of a live job changes nothing (the duplicate
-- key's no-op update), and ids already archived were left out by the caller (archive_ids_held).
-- The state ('scheduled' while run_at is ahead) is worked out by the caller.
INSERT INTO jobs (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of
)
VALUES (%(id)s, %(queue)s, %(task)s, %(payload)s, %(headers)s, %(state)s, %(priority)s, %(run_at)s, %(now)s,
        %(expires_at)s, %(max_attempts)s, %(max_deliveries)s, %(idempotency_key)s, %(ordering_key)s, %(replay_of)s)
ON DUPLICATE KEY UPDATE id = id

-- name: archive_ids_held
-- Which of a batch's ids have ended already (a producer's resend of a job that finished). The archive's
-- statements name their rows by primary key (a tuple, written as an IN list), as the jobs table's do (see
-- jobs_promote): a join of a JSON_TABLE to the archive scanned it whole while it held fewer rows than
-- MariaDB's estimate of the JSON (40).
SELECT id FROM archive FORCE INDEX (PRIMARY) WHERE id IN %(ids)s

-- name: idempotency_lock
-- The key's row, read once inserting it found it taken. A shared lock, as the failed insert took: the
-- holder cannot change until the transaction ends, and producers reading the same taken key do not each
-- wait to upgrade to an exclusive lock another's shared lock blocks (a deadlock). Only a retake of an
-- expired key takes one (idempotency_retake).
SELECT job_id, expires_at FROM idempotency_keys WHERE queue = %(queue)s AND `key` = %(key)s LOCK IN SHARE MODE

-- name: idempotency_take
INSERT INTO idempotency_keys (queue, `key`, job_id, expires_at) VALUES (%(queue)s, %(key)s, %(job_id)s, %(expires_at)s)

-- name: idempotency_retake
UPDATE idempotency_keys SET job_id = %(job_id)s, expires_at = %(expires_at)s
WHERE queue = %(queue)s AND `key` = %(key)s

-- name: idempotency_holder_job
SELECT task, payload FROM jobs WHERE id = %(id)s
UNION ALL
SELECT task, payload FROM archive WHERE id = %(id)s

-- name: jobs_promote_pick
-- Run by jobs_acquire first, in its transaction: the queue's scheduled jobs that are due, at most 1,000
-- per acquire, the earliest first (as on the other engines), read in jobs_scheduled's order and locked.
-- One probe when nothing is due. SKIP LOCKED: a due row another acquire is promoting is its, and a row
-- an application inserted in a transaction still open (send(conn=...)) held every acquire of the queue
-- until that transaction ended. (An UPDATE ... ORDER BY ... LIMIT sorted every due row first: a
-- backlog of a million retries that came due during an outage was read whole by every acquire.)
SELECT id FROM jobs FORCE INDEX (jobs_scheduled)
WHERE queue = %(queue)s AND state = 'scheduled' AND run_at <= %(now)s
ORDER BY run_at
LIMIT 1000
FOR UPDATE SKIP LOCKED

-- name: jobs_promote
-- The picked jobs become pending, so that the acquire that follows sees them. Rows are named by primary
-- key (a tuple): joined to a JSON_TABLE, a jobs table of fewer rows than MariaDB's estimate of the JSON
-- (40) was scanned whole, and an UPDATE locks every row it scans (another queue's, an open transaction's).
UPDATE jobs SET state = 'pending' WHERE id IN %(ids)s

-- name: jobs_next_scheduled
SELECT run_at FROM jobs WHERE queue = %(queue)s AND state = 'scheduled' ORDER BY run_at LIMIT 1

-- name: jobs_acquire_pick
-- Walks jobs_ready in hand-out order, locking at most `limit` rows and skipping those another
-- worker holds. Per-key FIFO: a keyed job is eligible only as the head of its key (no live row of
-- the key with a smaller id) and while no job of its key is in flight; the subqueries are plain
-- reads (a locked head is still seen, so its successors stay back). The caller then leases exactly
-- the rows picked. The indexes are named: with a queue of unkeyed jobs the optimizer's statistics
-- made each probe a scan of the queue (jobs_scheduled for the head test, every processing row for
-- the in-flight test), and a filesort under FOR UPDATE would lock every row it read.
SELECT j.id, j.queue, j.task, j.payload, j.headers, j.priority, j.run_at, j.enqueued_at, j.expires_at,
       j.attempts, j.deliveries, j.max_attempts, j.max_deliveries, j.idempotency_key, j.ordering_key,
       j.rescues
FROM jobs AS j FORCE INDEX (jobs_ready)
WHERE j.queue = %(queue)s
  AND j.state = 'pending'
  AND j.run_at <= %(now)s
  AND (
      j.ordering_key IS NULL
      OR (
          NOT EXISTS (
              SELECT 1 FROM jobs AS k FORCE INDEX (jobs_ordering)
              WHERE k.queue = j.queue AND k.ordering_key = j.ordering_key AND k.id < j.id
          )
          AND NOT EXISTS (
              SELECT 1 FROM jobs AS f FORCE INDEX (jobs_ordering_in_flight)
              WHERE f.queue = j.queue AND f.ordering_key = j.ordering_key AND f.state = 'processing'
          )
      )
  )
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: jobs_acquire_lease
-- Each picked row gets its own receipt (minted by the caller): a JSON array of [id, receipt].
-- A lease is not a delivery: deliveries is counted when the handler starts.
UPDATE jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id      CHAR(36) CHARACTER SET ascii PATH '$[0]',
    receipt VARCHAR(64) PATH '$[1]'
)) AS r ON j.id = r.id
SET j.state = 'processing',
    j.receipt = r.receipt,
    j.lease_expires_at = %(lease_expires_at)s,
    j.worker_id = %(worker_id)s,
    j.started_at = %(now)s,
    j.first_started_at = coalesce(j.first_started_at, %(now)s)
WHERE j.id IN %(ids)s

-- name: leases_lock
-- The deliveries of a batch that still hold their lease (same id and receipt, still processing),
-- locked for the update that follows in the same transaction. The heartbeat's call (wait=False) adds
-- SKIP LOCKED in Python: a row another transaction holds is skipped (asked again next beat).
SELECT j.id, j.receipt, j.queue
FROM jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id      CHAR(36) CHARACTER SET ascii PATH '$.id',
    receipt VARCHAR(64) PATH '$.receipt'
)) AS r ON j.id = r.id AND j.receipt = r.receipt
WHERE j.id IN %(ids)s AND j.state = 'processing'
FOR UPDATE

-- name: jobs_start_many
-- Count deliveries as started before their outcome, for the rows leases_lock returned (named by primary
-- key, as in jobs_promote).
UPDATE jobs SET deliveries = deliveries + 1 WHERE id IN %(ids)s

-- name: leases_extend_many
UPDATE jobs SET lease_expires_at = %(lease_expires_at)s WHERE id IN %(ids)s

-- name: leases_held
-- The deliveries of a batch still leased by them, read without locking (the heartbeat's: a row another
-- transaction holds is still held by its delivery, and is extended at the next beat).
SELECT j.id, j.receipt
FROM jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id      CHAR(36) CHARACTER SET ascii PATH '$.id',
    receipt VARCHAR(64) CHARACTER SET utf8mb4 PATH '$.receipt'
)) AS r ON j.id = r.id AND j.receipt = r.receipt
WHERE j.id IN %(ids)s AND j.state = 'processing'

-- name: jobs_finish_count
-- Before the archive insert, in the same transaction: add the outcomes of exactly the deliveries it
-- will archive (same join) to queue_counters, so the totals commit with the archive rows.
INSERT INTO queue_counters (queue, task, completed, dead, expired, cancelled)
SELECT j.queue, j.task, sum(f.state = 'completed'), sum(f.state = 'dead'), sum(f.state = 'expired'),
       sum(f.state = 'cancelled')
FROM jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id      CHAR(36) CHARACTER SET ascii PATH '$.id',
    receipt VARCHAR(64) PATH '$.receipt',
    state   VARCHAR(12) PATH '$.state'
)) AS f ON j.id = f.id AND j.receipt = f.receipt
WHERE j.id IN %(ids)s AND j.state = 'processing'
GROUP BY j.queue, j.task
ON DUPLICATE KEY UPDATE
    completed = completed + VALUES(completed), dead = dead + VALUES(dead),
    expired = expired + VALUES(expired), cancelled = cancelled + VALUES(cancelled)

-- name: jobs_finish_archive
-- Copy each delivery whose id and receipt still match a processing row into the archive with its
-- terminal state. A stale receipt matches nothing, so a worker whose lease expired cannot overwrite
-- the outcome of a newer delivery.
INSERT INTO archive (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of,
    first_started_at, started_at, worker_id, error_type, error_message, traceback,
    finished_at, result, reason, replayed_by, rescues
)
SELECT j.id, j.queue, j.task, j.payload, j.headers, f.state, j.priority, j.run_at, j.enqueued_at,
       j.expires_at, j.attempts + f.ran, j.deliveries + (f.ran AND NOT f.counted), j.max_attempts,
       j.max_deliveries, j.idempotency_key, j.ordering_key, j.replay_of, j.first_started_at, j.started_at,
       j.worker_id, coalesce(f.error_type, j.error_type), coalesce(f.error_message, j.error_message),
       coalesce(f.traceback, j.traceback), %(now)s, f.result, f.reason, NULL, j.rescues
FROM jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id            CHAR(36) CHARACTER SET ascii PATH '$.id',
    receipt       VARCHAR(64) PATH '$.receipt',
    state         VARCHAR(12) PATH '$.state',
    result        LONGTEXT CHARACTER SET utf8mb4 PATH '$.result',
    reason        LONGTEXT CHARACTER SET utf8mb4 PATH '$.reason',
    error_type    LONGTEXT CHARACTER SET utf8mb4 PATH '$.error_type',
    error_message LONGTEXT CHARACTER SET utf8mb4 PATH '$.error_message',
    traceback     LONGTEXT CHARACTER SET utf8mb4 PATH '$.traceback',
    ran           INT PATH '$.ran',
    counted       INT PATH '$.counted'
)) AS f ON j.id = f.id AND j.receipt = f.receipt
WHERE j.id IN %(ids)s AND j.state = 'processing'

-- name: jobs_finish_delete
-- In the same transaction: remove exactly the rows just archived (same id, receipt and state test).
DELETE j FROM jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id      CHAR(36) CHARACTER SET ascii PATH '$.id',
    receipt VARCHAR(64) PATH '$.receipt'
)) AS f ON j.id = f.id AND j.receipt = f.receipt
WHERE j.id IN %(ids)s AND j.state = 'processing'

-- name: jobs_retry_many
-- Back to pending at the item's run_at (scheduled while that is ahead) with the attempt counted and
-- its error kept; the receipt is cleared so the failed delivery can no longer act on the job.
UPDATE jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id            CHAR(36) CHARACTER SET ascii PATH '$.id',
    receipt       VARCHAR(64) PATH '$.receipt',
    run_at        DOUBLE PATH '$.run_at',
    error_type    LONGTEXT CHARACTER SET utf8mb4 PATH '$.error_type',
    error_message LONGTEXT CHARACTER SET utf8mb4 PATH '$.error_message',
    traceback     LONGTEXT CHARACTER SET utf8mb4 PATH '$.traceback',
    counted       INT PATH '$.counted'
)) AS r ON j.id = r.id AND j.receipt = r.receipt
SET j.state = CASE WHEN r.run_at > %(now)s THEN 'scheduled' ELSE 'pending' END,
    j.attempts = j.attempts + 1,
    j.deliveries = j.deliveries + (NOT r.counted),
    j.run_at = r.run_at,
    j.error_type = r.error_type,
    j.error_message = r.error_message,
    j.traceback = r.traceback,
    j.receipt = NULL,
    j.lease_expires_at = NULL
WHERE j.id IN %(ids)s AND j.state = 'processing'

-- name: jobs_release_many
-- Hand back leased jobs that never started (graceful shutdown): ready again at once. A lease is not
-- a delivery, so deliveries stays, and a job never started before is again one that never started.
UPDATE jobs AS j
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
    id      CHAR(36) CHARACTER SET ascii PATH '$.id',
    receipt VARCHAR(64) PATH '$.receipt'
)) AS r ON j.id = r.id AND j.receipt = r.receipt
SET j.state = 'pending',
    j.receipt = NULL,
    j.lease_expires_at = NULL,
    j.first_started_at = CASE WHEN j.deliveries = 0 THEN NULL ELSE j.first_started_at END,
    j.started_at = CASE WHEN j.deliveries = 0 THEN NULL ELSE j.started_at END,
    j.worker_id = NULL
WHERE j.id IN %(ids)s AND j.state = 'processing'

-- name: jobs_rescue_pick
-- Expired leases, oldest first, through jobs_lease, locked for jobs_rescue_expired. SKIP LOCKED, as on
-- PostgreSQL: one UPDATE ... ORDER BY ... LIMIT waited for every expired lease it read, so one another
-- transaction held (a worker finishing it late, an operator's session) stalled every rescue for the lock
-- wait timeout; a skipped row is rescued by a later call. A leased row without a lease end (only raw SQL
-- makes one) has no lease to wait for: it is rescued too (NULL sorts first: the condition is one range of
-- jobs_lease, from its start to now), else it stayed processing for ever.
SELECT id FROM jobs FORCE INDEX (jobs_lease)
WHERE state = 'processing' AND (lease_expires_at < %(now)s OR lease_expires_at IS NULL)
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: jobs_rescue_expired
-- The rows jobs_rescue_pick locked, by primary key, back to pending. deliveries is kept (a lease is not a
-- delivery); rescues + 1 makes the job a suspect. Clearing the receipt fences the worker that lost the
-- lease.
UPDATE jobs
SET state = 'pending', receipt = NULL, lease_expires_at = NULL, rescues = rescues + 1
WHERE id IN %(ids)s AND state = 'processing' AND (lease_expires_at < %(now)s OR lease_expires_at IS NULL)

-- name: job_get_live
-- A scheduled row is a pending job (the state only says which range holds it).
SELECT id, queue, task, payload, headers, CASE state WHEN 'scheduled' THEN 'pending' ELSE state END AS state,
       priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, lease_expires_at, worker_id, error_type,
       error_message, traceback,
       NULL AS finished_at, NULL AS result, NULL AS reason, NULL AS replayed_by, rescues
FROM jobs WHERE id = %(id)s

-- name: job_get_archived
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive WHERE id = %(id)s

-- name: jobs_list
SELECT id, queue, task, payload, headers, CASE state WHEN 'scheduled' THEN 'pending' ELSE state END AS state,
       priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, lease_expires_at, worker_id, error_type,
       error_message, traceback,
       NULL AS finished_at, NULL AS result, NULL AS reason, NULL AS replayed_by, rescues
FROM jobs
WHERE (%(queue)s IS NULL OR queue = %(queue)s)
  AND (%(after)s IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s

-- name: queues_stats_live
-- Live counts per queue; pending is split into ready now and scheduled for later, by run_at against
-- now whichever range holds the row.
SELECT queue,
       sum(state <> 'processing' AND run_at <= %(now)s) AS pending,
       sum(state <> 'processing' AND run_at > %(now)s) AS scheduled,
       sum(state = 'processing') AS processing,
       min(CASE WHEN state <> 'processing' AND run_at <= %(now)s THEN run_at END) AS oldest_ready_at
FROM jobs
GROUP BY queue

-- name: queues_stats_totals
SELECT queue, sum(completed) AS completed, sum(dead) AS dead_total, sum(expired) AS expired,
       sum(cancelled) AS cancelled
FROM queue_counters
GROUP BY queue

-- name: queues_stats_dlq
SELECT queue, count(*) AS dead
FROM archive
WHERE state = 'dead' AND replayed_by IS NULL
GROUP BY queue

-- name: dead_list
-- Unreplayed dead letters, newest first, through archive_dead.
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive
WHERE state = 'dead' AND replayed_by IS NULL
  AND (%(queue)s IS NULL OR queue = %(queue)s)
  AND (%(task)s IS NULL OR task = %(task)s)
  AND (%(error_type)s IS NULL OR error_type = %(error_type)s)
  AND (%(before_at)s IS NULL OR finished_at < %(before_at)s OR (finished_at = %(before_at)s AND id < %(before_id)s))
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s

-- name: dead_replay_lock
-- The unreplayed dead letters among a replay's dead ids, locked for the insert and mark that follow. By
-- primary key: joined to the JSON of the replay's pairs, a small archive was read whole and every dead
-- letter locked, so one an operator's session held stalled every other replay and purge for the lock
-- wait timeout (MariaDB estimates a JSON_TABLE at 40 rows). The index is named: on a small archive the
-- optimizer read every dead letter through archive_dead instead, locking each.
SELECT id FROM archive FORCE INDEX (PRIMARY)
WHERE id IN %(ids)s AND state = 'dead' AND replayed_by IS NULL
FOR UPDATE

-- name: dead_replay_insert
-- Re-enqueue the locked dead letters (ids, as locked) as fresh jobs (attempts and deliveries start at 0,
-- run_at is now) that point back at their dead letter; the pairs (a JSON array of [dead id, new id]) give
-- each its new id.
INSERT INTO jobs (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of
)
SELECT r.new_id, a.queue, a.task, a.payload, a.headers, 'pending', a.priority, %(now)s, %(now)s, NULL,
       0, 0, a.max_attempts, a.max_deliveries, a.idempotency_key, a.ordering_key, a.id
FROM archive AS a FORCE INDEX (PRIMARY)
JOIN JSON_TABLE(%(replays)s, '$[*]' COLUMNS (
    dead_id CHAR(36) CHARACTER SET ascii PATH '$[0]',
    new_id  CHAR(36) CHARACTER SET ascii PATH '$[1]'
)) AS r ON a.id = r.dead_id
WHERE a.id IN %(ids)s AND a.state = 'dead' AND a.replayed_by IS NULL

-- name: dead_replay_mark
UPDATE archive AS a FORCE INDEX (PRIMARY)
JOIN JSON_TABLE(%(replays)s, '$[*]' COLUMNS (
    dead_id CHAR(36) CHARACTER SET ascii PATH '$[0]',
    new_id  CHAR(36) CHARACTER SET ascii PATH '$[1]'
)) AS r ON a.id = r.dead_id
SET a.replayed_by = r.new_id
WHERE a.id IN %(ids)s AND a.state = 'dead' AND a.replayed_by IS NULL

-- name: dead_replay_rekey
-- After dead_replay_mark: a replayed dead letter that still holds its idempotency key inside the
-- dedup window gives it to its replay (see the SQLite statement of this name for why). The dead letters
-- are named by primary key (an IN list) and read first (STRAIGHT_JOIN), each key then by its primary key:
-- with an IN list about as long as the keys table, MariaDB read idempotency_keys whole and the archive by
-- k.job_id, and an UPDATE locks every row it reads, so a live job's key another session held stalled the
-- replay for the lock wait timeout. The one key it still waits for is its own dead letter's, which it
-- hands over (bounded by the lock wait timeout: unavailable, nothing written).
UPDATE archive AS a FORCE INDEX (PRIMARY)
STRAIGHT_JOIN idempotency_keys AS k FORCE INDEX (PRIMARY)
    ON k.queue = a.queue AND k.`key` = a.idempotency_key AND k.job_id = a.id
JOIN JSON_TABLE(%(replays)s, '$[*]' COLUMNS (
    dead_id CHAR(36) CHARACTER SET ascii PATH '$[0]',
    new_id  CHAR(36) CHARACTER SET ascii PATH '$[1]'
)) AS r ON a.id = r.dead_id AND a.replayed_by = r.new_id
SET k.job_id = r.new_id
WHERE a.id IN %(ids)s AND (k.expires_at IS NULL OR k.expires_at > %(now)s)

-- name: dead_purge_lock
-- By primary key, as dead_replay_lock.
SELECT id FROM archive FORCE INDEX (PRIMARY) WHERE id IN %(ids)s AND state = 'dead' FOR UPDATE

-- name: dead_purge_many
-- The dead letters dead_purge_lock locked.
DELETE a FROM archive AS a FORCE INDEX (PRIMARY) WHERE a.id IN %(ids)s AND a.state = 'dead'

-- name: audit_insert
INSERT INTO audit (at, actor, action, reason, job_ids, details)
VALUES (%(now)s, %(actor)s, %(action)s, %(reason)s, %(job_ids)s, %(details)s)

-- name: audit_list
-- job_ids is a JSON array of ids as str(UUID) writes them: a job's quoted id is found in it as it is.
SELECT id, at, actor, action, reason, job_ids, details
FROM audit
WHERE %(job_id)s IS NULL OR INSTR(job_ids, %(job_id)s) > 0
ORDER BY id DESC
LIMIT %(limit)s

-- name: archive_read_first
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive
ORDER BY finished_at, id
LIMIT %(limit)s

-- name: archive_read_after
-- Keyset pagination strictly after the watermark, so an export that resumes never reads a row twice.
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive
WHERE finished_at > %(after_at)s OR (finished_at = %(after_at)s AND id > %(after_id)s)
ORDER BY finished_at, id
LIMIT %(limit)s

-- name: processed_key_lock
-- Shared, as idempotency_lock is and for the same reason.
SELECT expires_at FROM processed_keys WHERE `key` = %(key)s LOCK IN SHARE MODE

-- name: processed_key_take
INSERT INTO processed_keys (`key`, expires_at, claimed_at) VALUES (%(key)s, %(expires_at)s, %(now)s)

-- name: processed_key_retake
UPDATE processed_keys SET expires_at = %(expires_at)s, claimed_at = %(now)s WHERE `key` = %(key)s

-- name: idempotency_keys_prune
-- Keys without an expiry are held for ever and never pruned; a key has expired once expires_at <= now.
DELETE FROM idempotency_keys
WHERE expires_at IS NOT NULL AND expires_at <= %(now)s
ORDER BY expires_at
LIMIT %(limit)s

-- name: processed_keys_prune
DELETE FROM processed_keys WHERE expires_at <= %(now)s ORDER BY expires_at LIMIT %(limit)s

-- name: schedules_upsert
-- Re-declaring a schedule keeps its pause state, its last run and, unless the cron changed, its
-- next tick. MySQL assigns left to right and a later assignment sees an earlier one's value, so
-- next_run_at is decided before cron is overwritten.
INSERT INTO schedules (name, cron, task, queue, payload, next_run_at, paused, priority, last_run_at)
VALUES (%(name)s, %(cron)s, %(task)s, %(queue)s, %(payload)s, %(next_run_at)s, %(paused)s, %(priority)s,
        %(last_run_at)s)
ON DUPLICATE KEY UPDATE
    next_run_at = IF(cron = VALUES(cron), next_run_at, VALUES(next_run_at)),
    cron = VALUES(cron),
    task = VALUES(task),
    queue = VALUES(queue),
    payload = VALUES(payload),
    priority = VALUES(priority)

-- name: schedules_list
SELECT name, cron, task, queue, payload, next_run_at, paused, priority, last_run_at
FROM schedules
ORDER BY name

-- name: schedules_update
UPDATE schedules
SET paused = coalesce(%(paused)s, paused),
    cron = coalesce(%(cron)s, cron),
    next_run_at = coalesce(%(next_run_at)s, next_run_at)
WHERE name = %(name)s

-- name: schedules_delete
DELETE FROM schedules WHERE name = %(name)s

-- name: schedule_fire
-- Compare-and-set on next_run_at: of several schedulers that read the same due tick, exactly one
-- update matches (the row lock serialises them), and only that caller inserts the tick's job, in
-- the same transaction. The update also compares the definition the scheduler read (read_*): an
-- operator's change between its read and this fire that kept the next tick (a new cron with the same
-- next tick, a new task or payload) would otherwise fire a job of the old definition and store a next
-- tick of the old cron. The table's collation is binary, so a change of case is a change.
UPDATE schedules
SET next_run_at = %(next_run_at_after)s, last_run_at = %(last_run_at)s
WHERE name = %(name)s AND paused = 0 AND next_run_at = %(due_at)s
  AND cron = %(read_cron)s AND task = %(read_task)s AND queue = %(read_queue)s
  AND payload = %(read_payload)s AND priority = %(read_priority)s

-- name: schedule_move
-- The same compare-and-set as schedule_fire (next tick and definition read), firing nothing.
UPDATE schedules
SET next_run_at = %(next_run_at)s
WHERE name = %(name)s AND paused = 0 AND next_run_at = %(due_at)s
  AND cron = %(read_cron)s AND task = %(read_task)s AND queue = %(read_queue)s
  AND payload = %(read_payload)s AND priority = %(read_priority)s

-- name: subscriptions_upsert
INSERT INTO subscriptions (topic, queue, task, filter)
VALUES (%(topic)s, %(queue)s, %(task)s, %(filter)s)
ON DUPLICATE KEY UPDATE task = VALUES(task), filter = VALUES(filter)

-- name: subscriptions_list
SELECT topic, queue, task, filter
FROM subscriptions
WHERE %(topic)s IS NULL OR topic = %(topic)s
ORDER BY topic, queue

-- name: subscriptions_delete
DELETE FROM subscriptions WHERE topic = %(topic)s AND queue = %(queue)s

-- name: queue_depth
SELECT count(*) FROM jobs WHERE queue = %(queue)s

-- name: queue_keys_held
-- Which of a send's idempotency keys (a JSON array) are held at now.
SELECT k.`key` FROM idempotency_keys AS k
JOIN JSON_TABLE(%(keys)s, '$[*]' COLUMNS (wanted VARCHAR(512) CHARACTER SET utf8mb4 PATH '$')) AS w ON k.`key` = w.wanted
WHERE k.queue = %(queue)s AND (k.expires_at IS NULL OR k.expires_at > %(now)s)

-- name: queue_drained
SELECT count(*) FROM archive
WHERE queue = %(queue)s
  AND state IN ('completed', 'dead', 'expired', 'cancelled')
  AND finished_at >= %(since)s AND finished_at <= %(now)s

-- name: archive_prune_pick
-- Retention: each row's cutoff is its queue's (JSON arrays of [queue, seconds]) or the default, dead
-- letters having their own. The outer finished_at bound (the latest cutoff of all) lets the scan
-- walk archive_finished from the oldest row and stop early. Picked first, as a DELETE with a join
-- takes no LIMIT. The index is named: MariaDB read the whole archive through archive_queue_state_finished
-- and sorted it, locking every row read, so a recent row another transaction held stalled retention.
-- SKIP LOCKED: a row past retention that another transaction holds (an operator's session) is left for
-- a later prune; waited for, it failed the prune after the lock wait timeout, every time until released.
SELECT a.id
FROM archive AS a FORCE INDEX (archive_finished)
LEFT JOIN JSON_TABLE(%(before)s, '$[*]' COLUMNS (
    queue  VARCHAR(200) CHARACTER SET utf8mb4 PATH '$[0]',
    cutoff DOUBLE PATH '$[1]'
)) AS b ON b.queue = a.queue
LEFT JOIN JSON_TABLE(%(dead_before)s, '$[*]' COLUMNS (
    queue  VARCHAR(200) CHARACTER SET utf8mb4 PATH '$[0]',
    cutoff DOUBLE PATH '$[1]'
)) AS d ON d.queue = a.queue
WHERE a.finished_at < %(latest_cutoff)s
  AND a.finished_at < CASE
      WHEN a.state = 'dead' THEN coalesce(d.cutoff, %(default_dead_before)s)
      ELSE coalesce(b.cutoff, %(default_before)s)
  END
ORDER BY a.finished_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: archive_delete
-- The rows archive_prune_pick locked, by primary key (joined to their JSON, a small archive was scanned
-- whole: a recent row another transaction held stalled retention for the lock wait timeout).
DELETE a FROM archive AS a FORCE INDEX (PRIMARY) WHERE a.id IN %(ids)s

-- name: tokens_insert
-- A taken name or id is a duplicate-key error the caller answers with False.
INSERT INTO tokens (id, name, role, queues, secret_hash, created_at, expires_at, revoked_at)
VALUES (%(id)s, %(name)s, %(role)s, %(queues)s, %(secret_hash)s, %(created_at)s, %(expires_at)s, NULL)

-- name: token_get
SELECT id, name, role, queues, secret_hash, created_at, expires_at, revoked_at
FROM tokens
WHERE id = %(id)s

-- name: tokens_list
SELECT id, name, role, queues, secret_hash, created_at, expires_at, revoked_at
FROM tokens
ORDER BY name

-- name: tokens_revoke
UPDATE tokens SET revoked_at = %(now)s
WHERE name = %(name)s AND revoked_at IS NULL

-- name: task_totals
SELECT queue, task, completed, dead, expired, cancelled
FROM queue_counters
WHERE %(queue)s IS NULL OR queue = %(queue)s
ORDER BY queue, task

-- name: workers_beat
INSERT INTO workers (id, host, pid, queues, concurrency, started_at, last_seen)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(started_at)s, %(now)s)
ON DUPLICATE KEY UPDATE
    last_seen = GREATEST(last_seen, VALUES(last_seen)), queues = VALUES(queues), concurrency = VALUES(concurrency)

-- name: workers_remove
DELETE FROM workers WHERE id = %(id)s

-- name: workers_list
SELECT id, host, pid, queues, concurrency, started_at, last_seen
FROM workers
WHERE %(seen_after)s IS NULL OR last_seen >= %(seen_after)s
ORDER BY id

-- name: workers_in_flight
-- The jobs each worker holds leases on, through jobs_worker.
SELECT worker_id, id FROM jobs WHERE state = 'processing' AND worker_id IS NOT NULL ORDER BY id

-- name: workers_prune
DELETE FROM workers WHERE last_seen < %(before)s

-- name: alerts_list
SELECT rule, queue, state, since, value, threshold, message FROM alerts ORDER BY rule, queue

-- name: alerts_change
-- A state change; the row lock makes it once, however many evaluators try.
UPDATE alerts SET state = %(state)s, since = %(since)s, value = %(value)s, threshold = %(threshold)s,
                  message = %(message)s, updated_at = %(now)s
WHERE rule = %(rule)s AND queue = %(queue)s AND state <> %(state)s

-- name: alerts_fire_new
-- A duplicate key (another evaluator fired it first) is answered by the caller.
INSERT INTO alerts (rule, queue, state, since, value, threshold, message, updated_at)
VALUES (%(rule)s, %(queue)s, %(state)s, %(since)s, %(value)s, %(threshold)s, %(message)s, %(now)s)

-- name: alerts_refresh
UPDATE alerts SET value = %(value)s, threshold = %(threshold)s, message = %(message)s, updated_at = %(now)s
WHERE rule = %(rule)s AND queue = %(queue)s AND state = %(state)s

-- name: database_health
-- The oldest open transaction of another session on this database (InnoDB's purge cannot remove the rows
-- deleted since it began; a reading transaction holds its snapshot too). information_schema.innodb_trx needs
-- the PROCESS privilege: without it the caller reports nothing. trx_started has whole seconds only: a
-- second less is a bound the age is surely past (a transaction a moment old, begun in the last second,
-- read as up to a second old, fired an alert of a fraction of a second).
SELECT coalesce(greatest(0, %(now)s - min(UNIX_TIMESTAMP(t.trx_started)) - 1), 0) AS oldest_transaction_age
FROM information_schema.innodb_trx AS t
JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id
WHERE p.db = DATABASE() AND t.trx_mysql_thread_id <> CONNECTION_ID()

-- name: database_now
SELECT UNIX_TIMESTAMP(NOW(6))
