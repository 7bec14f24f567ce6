-- Named statements of the SQLite backend, loaded by conveyor.backends._sql.
--
-- Conventions: times are REAL unix seconds; batch statements take their items as one JSON array
-- parameter read with json_each, so that a batch is one statement however many jobs it names.
-- Times inside those arrays are integer microseconds, divided here, because integers survive the
-- JSON round trip exactly where decimal floats might not.

-- name: migrations_table
-- The ledger of applied migrations; created before anything else so that migrate() can read it
-- inside the same write transaction that applies the missing versions.
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)

-- name: migrations_applied
-- Read inside BEGIN IMMEDIATE, so a second process calling migrate() at the same time waits for
-- the first and then sees its versions instead of applying them again.
SELECT version FROM schema_migrations ORDER BY version

-- name: migrations_ledger_exists
-- Whether migrate() has ever run here (readiness checks ask before the ledger exists).
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'

-- name: migrations_record
INSERT INTO schema_migrations (version, name, applied_at) VALUES (:version, :name, :now)

-- name: jobs_insert
-- One row per job, run with executemany inside one transaction: SQLite has no round trip to save,
-- so one prepared statement per row is as fast as one multi-row statement. A job id is accepted
-- once: a producer that resends a job it already sent (same id, after an error it could not
-- interpret) changes nothing, whether the job is still live (ON CONFLICT) or has ended (the
-- archive probe, one primary-key lookup). A job whose run_at is ahead is 'scheduled' (jobs_scheduled,
-- not jobs_ready: migration 0007) until jobs_promote makes it pending.
INSERT INTO jobs (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of
)
SELECT :id, :queue, :task, :payload, :headers, CASE WHEN :run_at > :now THEN 'scheduled' ELSE 'pending' END,
       :priority, :run_at, :now, :expires_at,
       0, 0, :max_attempts, :max_deliveries, :idempotency_key, :ordering_key, :replay_of
WHERE NOT EXISTS (SELECT 1 FROM archive WHERE id = :id)
ON CONFLICT (id) DO NOTHING

-- name: idempotency_claim
-- Take the key if it is free or its window has passed; RETURNING yields a row only when this job
-- now holds the key. A key held by a live window makes the upsert's WHERE false, so nothing
-- changes and nothing is returned: the caller then looks the holder up.
INSERT INTO idempotency_keys (queue, key, job_id, expires_at)
VALUES (:queue, :key, :job_id, :expires_at)
ON CONFLICT (queue, key) DO UPDATE
    SET job_id = excluded.job_id, expires_at = excluded.expires_at
    WHERE idempotency_keys.expires_at IS NOT NULL AND idempotency_keys.expires_at <= :now
RETURNING job_id

-- name: idempotency_holder
SELECT job_id FROM idempotency_keys WHERE queue = :queue AND key = :key

-- name: idempotency_holder_job
-- The task and payload of a key's holder, live or ended, read by a strict send
-- (JobsInsertParams.strict_keys) in its own transaction, after its rows are written: a holder
-- earlier in the same batch is then found too.
SELECT task, payload FROM jobs WHERE id = :id
UNION ALL
SELECT task, payload FROM archive WHERE id = :id

-- name: jobs_promote
-- Run by jobs_acquire first, in its transaction: the queue's scheduled jobs that are due become
-- pending, so that the acquire sees them. A range scan of jobs_scheduled (queue, run_at): one probe
-- when nothing is due, however many jobs are scheduled later. At most 1,000, the earliest first, as
-- on PostgreSQL: a backlog that came due while no worker ran (a million retries after an outage)
-- is promoted 1,000 per acquire rather than in one statement holding the write lock for seconds.
UPDATE jobs SET state = 'pending'
WHERE id IN (
    SELECT id FROM jobs
    WHERE queue = :queue AND state = 'scheduled' AND run_at <= :now
    ORDER BY run_at
    LIMIT 1000
)

-- name: jobs_next_scheduled
-- When the queue's next scheduled job is due (no row: none): the first entry of its jobs_scheduled range.
SELECT run_at FROM jobs WHERE queue = :queue AND state = 'scheduled' ORDER BY run_at LIMIT 1

-- name: jobs_acquire
-- Runs inside BEGIN IMMEDIATE, which takes the database's write lock before reading, so two
-- workers (threads or processes) can never select the same rows: SQLite's answer to SKIP LOCKED.
-- The subquery walks jobs_ready in hand-out order. A job with an ordering key is eligible only
-- as the head of its key (no live row of the key with a smaller id: one probe of jobs_ordering)
-- and only while no job of its key is in flight (one probe of jobs_ordering_in_flight); the
-- second test covers a smaller id that committed after a larger one was already handed out.
-- RETURNING does not promise any order, so the caller sorts.
-- A lease is not a delivery: deliveries is counted when the handler starts (with its outcome, or
-- by jobs_start_many), so jobs a worker only prefetched are not charged if it dies.
-- :lease_expires_at is now + the visibility timeout, added by the caller on exact microseconds: a
-- sum of two REAL seconds here could round below the exact end, and rescue (lease < now) would
-- then take the lease back at the very instant it should still hold.
UPDATE jobs
SET state = 'processing',
    receipt = lower(hex(randomblob(16))),
    lease_expires_at = :lease_expires_at,
    worker_id = :worker_id,
    started_at = :now,
    first_started_at = coalesce(first_started_at, :now)
WHERE id IN (
    SELECT j.id
    FROM jobs AS j
    WHERE j.queue = :queue
      AND j.state = 'pending'
      AND j.run_at <= :now
      AND (
          j.ordering_key IS NULL
          OR (
              NOT EXISTS (
                  SELECT 1 FROM jobs AS k
                  WHERE k.queue = j.queue AND k.ordering_key = j.ordering_key AND k.id < j.id
              )
              AND NOT EXISTS (
                  SELECT 1 FROM jobs AS f
                  WHERE f.queue = j.queue AND f.ordering_key = j.ordering_key AND f.state = 'processing'
              )
          )
      )
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT :limit
)
RETURNING id, queue, task, payload, headers, priority, run_at, enqueued_at, expires_at, attempts,
    deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, receipt,
    lease_expires_at, rescues

-- name: jobs_start_many
-- Count deliveries as started before their outcome: a suspect job's just before its handler runs
-- (poison protection reads the count, so a handler that kills its worker has been counted), and jobs
-- running long from the heartbeat. Same (id, receipt) match as every outcome; RETURNING names the
-- deliveries that still held their lease (by receipt too: an item naming the same job with a stale
-- receipt did not).
UPDATE jobs
SET deliveries = deliveries + 1
FROM (
    SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.receipt') AS receipt
    FROM json_each(:items)
) AS r
WHERE jobs.id = r.id AND jobs.receipt = r.receipt AND jobs.state = 'processing'
RETURNING jobs.id AS id, jobs.receipt AS receipt

-- name: jobs_finish_count
-- Before the archive insert, in the same transaction: add the outcomes of exactly the deliveries
-- it will archive (same join) to queue_counters, so the totals commit with the archive rows.
WITH f AS (
    SELECT json_extract(value, '$.id') AS id,
           json_extract(value, '$.receipt') AS receipt,
           json_extract(value, '$.state') AS state
    FROM json_each(:items)
)
INSERT INTO queue_counters (queue, task, completed, dead, expired, cancelled)
SELECT j.queue, j.task, sum(f.state = 'completed'), sum(f.state = 'dead'), sum(f.state = 'expired'),
       sum(f.state = 'cancelled')
FROM f JOIN jobs AS j ON j.id = f.id AND j.receipt = f.receipt
WHERE j.state = 'processing'
GROUP BY j.queue, j.task
ON CONFLICT (queue, task) DO UPDATE SET
    completed = completed + excluded.completed, dead = dead + excluded.dead,
    expired = expired + excluded.expired, cancelled = cancelled + excluded.cancelled

-- name: jobs_finish_archive
-- First half of finishing a batch: copy each delivery whose id and receipt still match a
-- processing row into the archive with its terminal state. A stale receipt matches nothing, so a
-- worker whose lease expired cannot overwrite the outcome of a newer delivery.
WITH f AS (
    SELECT json_extract(value, '$.id') AS id,
           json_extract(value, '$.receipt') AS receipt,
           json_extract(value, '$.state') AS state,
           json_extract(value, '$.result') AS result,
           json_extract(value, '$.reason') AS reason,
           json_extract(value, '$.error_type') AS error_type,
           json_extract(value, '$.error_message') AS error_message,
           json_extract(value, '$.traceback') AS traceback,
           json_extract(value, '$.ran') AS ran,
           json_extract(value, '$.counted') AS counted
    FROM json_each(:items)
)
INSERT INTO archive (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of,
    first_started_at, started_at, worker_id, error_type, error_message, traceback,
    finished_at, result, reason, replayed_by, rescues
)
SELECT j.id, j.queue, j.task, j.payload, j.headers, f.state, j.priority, j.run_at, j.enqueued_at,
       j.expires_at, j.attempts + f.ran, j.deliveries + (f.ran AND NOT f.counted), j.max_attempts,
       j.max_deliveries,
       j.idempotency_key, j.ordering_key, j.replay_of, j.first_started_at, j.started_at,
       j.worker_id, coalesce(f.error_type, j.error_type), coalesce(f.error_message, j.error_message),
       coalesce(f.traceback, j.traceback), :now, f.result, f.reason, NULL, j.rescues
FROM f JOIN jobs AS j ON j.id = f.id AND j.receipt = f.receipt
WHERE j.state = 'processing'

-- name: jobs_finish_delete
-- Second half, in the same transaction: remove exactly the rows just archived (same id, receipt
-- and state test), so the jobs table keeps live rows only. Its change count is the applied count.
DELETE FROM jobs
WHERE state = 'processing'
  AND (id, receipt) IN (
      SELECT json_extract(value, '$.id'), json_extract(value, '$.receipt') FROM json_each(:items)
  )

-- name: jobs_retry_many
-- Back to pending at the item's run_at (scheduled while that is ahead) with the attempt counted and
-- its error kept for inspection; the receipt is cleared so the failed delivery can no longer act on
-- the job. Returns one row per job retried: its queue, and its run_at if it is scheduled (for
-- jobs_next_due).
UPDATE jobs
SET state = CASE WHEN r.run_at > :now THEN 'scheduled' ELSE 'pending' END,
    attempts = attempts + 1,
    deliveries = deliveries + (NOT r.counted),
    run_at = r.run_at,
    error_type = r.error_type,
    error_message = r.error_message,
    traceback = r.traceback,
    receipt = NULL,
    lease_expires_at = NULL
FROM (
    SELECT json_extract(value, '$.id') AS id,
           json_extract(value, '$.receipt') AS receipt,
           json_extract(value, '$.run_at_us') / 1000000.0 AS run_at,
           json_extract(value, '$.error_type') AS error_type,
           json_extract(value, '$.error_message') AS error_message,
           json_extract(value, '$.traceback') AS traceback,
           json_extract(value, '$.counted') AS counted
    FROM json_each(:items)
) AS r
WHERE jobs.id = r.id AND jobs.receipt = r.receipt AND jobs.state = 'processing'
RETURNING jobs.queue, CASE WHEN jobs.state = 'scheduled' THEN jobs.run_at END

-- name: jobs_release_many
-- Hand back leased jobs that never started (graceful shutdown): ready again at once. A lease is not a
-- delivery, so deliveries stays, and a job never started before is again one that never started.
UPDATE jobs
SET state = 'pending',
    receipt = NULL,
    lease_expires_at = NULL,
    first_started_at = CASE WHEN deliveries = 0 THEN NULL ELSE first_started_at END,
    started_at = CASE WHEN deliveries = 0 THEN NULL ELSE started_at END,
    worker_id = NULL
FROM (
    SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.receipt') AS receipt
    FROM json_each(:items)
) AS r
WHERE jobs.id = r.id AND jobs.receipt = r.receipt AND jobs.state = 'processing'

-- name: leases_extend_many
-- Heartbeat: push the lease of every delivery still held (same receipt, still processing); the
-- (id, receipt) pairs returned tell the worker which leases it still has. The new end is computed
-- by the caller, as in jobs_acquire.
UPDATE jobs
SET lease_expires_at = :lease_expires_at
FROM (
    SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.receipt') AS receipt
    FROM json_each(:items)
) AS r
WHERE jobs.id = r.id AND jobs.receipt = r.receipt AND jobs.state = 'processing'
RETURNING jobs.id AS id, jobs.receipt AS receipt

-- name: jobs_rescue_expired
-- Expired leases go back to pending, oldest lease first, through the jobs_lease partial index.
-- deliveries is kept (a lease is not a delivery); rescues + 1 makes the job a suspect, whose starts
-- are counted before they run. Clearing the receipt fences the worker that lost the lease. A leased
-- row without a lease end (only raw SQL makes one) has no lease to wait for, and stayed processing for
-- ever: the second select rescues it too. It is a select of its own because an OR of the two conditions
-- made the walk of jobs_lease a scan of every leased row instead of a search of the expired ones.
UPDATE jobs
SET state = 'pending', receipt = NULL, lease_expires_at = NULL, rescues = rescues + 1
WHERE id IN (
    SELECT id FROM (
        SELECT id FROM jobs
        WHERE state = 'processing' AND lease_expires_at < :now
        ORDER BY lease_expires_at
        LIMIT :limit
    )
    UNION ALL
    SELECT id FROM (
        SELECT id FROM jobs
        WHERE state = 'processing' AND lease_expires_at IS NULL
        LIMIT :limit
    )
)

-- name: job_get_live
-- A scheduled row is a pending job (the state only says which index holds it: migration 0007).
SELECT id, queue, task, payload, headers, CASE state WHEN 'scheduled' THEN 'pending' ELSE state END AS state,
       priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, lease_expires_at, worker_id, error_type,
       error_message, traceback,
       NULL AS finished_at, NULL AS result, NULL AS reason, NULL AS replayed_by, rescues
FROM jobs WHERE id = :id

-- name: job_get_archived
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive WHERE id = :id

-- name: jobs_list
-- Live rows in id (enqueue) order after a keyset cursor, for export and inspection. A scheduled row
-- is a pending job.
SELECT id, queue, task, payload, headers, CASE state WHEN 'scheduled' THEN 'pending' ELSE state END AS state,
       priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, lease_expires_at, worker_id, error_type,
       error_message, traceback,
       NULL AS finished_at, NULL AS result, NULL AS reason, NULL AS replayed_by, rescues
FROM jobs
WHERE (:queue IS NULL OR queue = :queue)
  AND (:after IS NULL OR id > :after)
ORDER BY id
LIMIT :limit

-- name: queues_stats_live
-- Live counts per queue; pending is split into ready now and scheduled for later, by run_at against
-- now whichever index holds the row (a scheduled job that came due is ready before it is promoted).
SELECT queue,
       sum(state <> 'processing' AND run_at <= :now) AS pending,
       sum(state <> 'processing' AND run_at > :now) AS scheduled,
       sum(state = 'processing') AS processing,
       min(CASE WHEN state <> 'processing' AND run_at <= :now THEN run_at END) AS oldest_ready_at
FROM jobs
GROUP BY queue

-- name: queues_stats_totals
-- Terminal totals per queue from queue_counters: a few rows per queue, whatever the archive holds.
SELECT queue, sum(completed) AS completed, sum(dead) AS dead_total, sum(expired) AS expired,
       sum(cancelled) AS cancelled
FROM queue_counters
GROUP BY queue

-- name: queues_stats_dlq
-- The DLQ depth per queue from archive_dlq_queue, which holds unreplayed dead letters only.
SELECT queue, count(*) AS dead
FROM archive
WHERE state = 'dead' AND replayed_by IS NULL
GROUP BY queue

-- name: dead_list
-- Unreplayed dead letters, newest first, through the archive_dead partial index.
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive
WHERE state = 'dead' AND replayed_by IS NULL
  AND (:queue IS NULL OR queue = :queue)
  AND (:task IS NULL OR task = :task)
  AND (:error_type IS NULL OR error_type = :error_type)
  AND (:before_at IS NULL OR finished_at < :before_at OR (finished_at = :before_at AND id < :before_id))
ORDER BY finished_at DESC, id DESC
LIMIT :limit OFFSET :offset

-- name: dead_replay_insert
-- Re-enqueue unreplayed dead letters as fresh jobs (attempts and deliveries start at 0, run_at is
-- now) that point back at their dead letter. Dead ids that are not unreplayed dead letters join
-- nothing and are skipped. RETURNING tells the caller which pairs were replayed.
WITH r AS (
    SELECT json_extract(value, '$[0]') AS dead_id, json_extract(value, '$[1]') AS new_id
    FROM json_each(:replays)
)
INSERT INTO jobs (
    id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
    attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key, replay_of
)
SELECT r.new_id, a.queue, a.task, a.payload, a.headers, 'pending', a.priority, :now, :now, NULL,
       0, 0, a.max_attempts, a.max_deliveries, a.idempotency_key, a.ordering_key, a.id
FROM r JOIN archive AS a ON a.id = r.dead_id
WHERE a.state = 'dead' AND a.replayed_by IS NULL
RETURNING replay_of, id

-- name: dead_replay_mark
-- In the same transaction, point each replayed dead letter at its new job, which takes it out of
-- the DLQ listing and the DLQ depth.
UPDATE archive
SET replayed_by = r.new_id
FROM (
    SELECT json_extract(value, '$[0]') AS dead_id, json_extract(value, '$[1]') AS new_id
    FROM json_each(:replays)
) AS r
WHERE archive.id = r.dead_id AND archive.state = 'dead' AND archive.replayed_by IS NULL

-- name: dead_replay_rekey
-- In the same transaction, after dead_replay_mark: a replayed dead letter that still holds its
-- idempotency key inside the dedup window gives it to its replay, so that a producer's resend during
-- the window answers the live replay, not the dead letter. A key another job took after the window is
-- left alone, and the window's end does not move. Only the pairs just marked (replayed_by = new id)
-- hand a key over: a dead id named again after an earlier replay hands over nothing.
UPDATE idempotency_keys
SET job_id = r.new_id
FROM (
    SELECT a.queue, a.idempotency_key, a.id AS dead_id, a.replayed_by AS new_id
    FROM json_each(:replays) AS p
    JOIN archive AS a ON a.id = json_extract(p.value, '$[0]') AND a.replayed_by = json_extract(p.value, '$[1]')
    WHERE a.idempotency_key IS NOT NULL
) AS r
WHERE idempotency_keys.queue = r.queue AND idempotency_keys.key = r.idempotency_key
  AND idempotency_keys.job_id = r.dead_id
  AND (idempotency_keys.expires_at IS NULL OR idempotency_keys.expires_at > :now)

-- name: dead_purge_many
-- Delete dead letters for good; RETURNING names them for the audit row.
DELETE FROM archive
WHERE state = 'dead' AND id IN (SELECT value FROM json_each(:ids))
RETURNING id

-- name: audit_insert
INSERT INTO audit (at, actor, action, reason, job_ids, details)
VALUES (:now, :actor, :action, :reason, :job_ids, :details)

-- name: audit_list
-- job_ids is a JSON array of ids as str(UUID) writes them: a job's quoted id is found in it as it is.
SELECT id, at, actor, action, reason, job_ids, details
FROM audit
WHERE :job_id IS NULL OR instr(job_ids, :job_id) > 0
ORDER BY id DESC
LIMIT :limit

-- name: archive_read_first
-- The first page of an export: the archive in (finished_at, id) order through archive_finished.
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive
ORDER BY finished_at, id
LIMIT :limit

-- name: archive_read_after
-- Keyset pagination strictly after the watermark, so an export that resumes from its last row
-- never reads a row twice. A separate statement from the first page (rather than an
-- ":after IS NULL OR ..." test) so that the row-value comparison can seek archive_finished.
SELECT id, queue, task, payload, headers, state, priority, run_at, enqueued_at, expires_at,
       attempts, deliveries, max_attempts, max_deliveries, idempotency_key, ordering_key,
       replay_of, first_started_at, started_at, NULL AS lease_expires_at, worker_id, error_type,
       error_message, traceback, finished_at, result, reason, replayed_by, rescues
FROM archive
WHERE (finished_at, id) > (:after_at, :after_id)
ORDER BY finished_at, id
LIMIT :limit

-- name: processed_keys_claim
-- Consumer-side idempotency: take the key if it is new or its previous claim expired. RETURNING
-- yields a row only when this call claimed it; an unexpired claim makes the upsert's WHERE false.
INSERT INTO processed_keys (key, expires_at, claimed_at)
VALUES (:key, :expires_at, :now)
ON CONFLICT (key) DO UPDATE
    SET expires_at = excluded.expires_at, claimed_at = excluded.claimed_at
    WHERE processed_keys.expires_at <= :now
RETURNING key

-- name: idempotency_keys_prune
-- Bounded delete through idempotency_keys_expiry (SQLite has no DELETE ... LIMIT by default, so
-- the batch is chosen by rowid). Keys without an expiry are held for ever and never pruned. A key
-- has expired once expires_at <= now: from then on a claim takes it over (idempotency_claim), so it
-- is pruned from then on too, as on PostgreSQL.
DELETE FROM idempotency_keys
WHERE rowid IN (
    SELECT rowid FROM idempotency_keys
    WHERE expires_at IS NOT NULL AND expires_at <= :now
    ORDER BY expires_at
    LIMIT :limit
)

-- name: processed_keys_prune
DELETE FROM processed_keys
WHERE rowid IN (
    SELECT rowid FROM processed_keys WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit
)

-- name: schedules_upsert
-- Re-declaring a schedule (every worker start does) keeps its pause state, its last run and, unless
-- the cron changed, its next tick: otherwise a restart could skip or repeat a tick.
INSERT INTO schedules (name, cron, task, queue, payload, next_run_at, paused, priority, last_run_at)
VALUES (:name, :cron, :task, :queue, :payload, :next_run_at, :paused, :priority, :last_run_at)
ON CONFLICT (name) DO UPDATE
    SET cron = excluded.cron,
        task = excluded.task,
        queue = excluded.queue,
        payload = excluded.payload,
        priority = excluded.priority,
        next_run_at = CASE WHEN schedules.cron = excluded.cron THEN schedules.next_run_at
                           ELSE excluded.next_run_at END

-- name: schedules_list
SELECT name, cron, task, queue, payload, next_run_at, paused, priority, last_run_at
FROM schedules
ORDER BY name

-- name: schedules_update
-- Only the fields given change (a NULL parameter keeps the stored value).
UPDATE schedules
SET paused = coalesce(:paused, paused),
    cron = coalesce(:cron, cron),
    next_run_at = coalesce(:next_run_at, next_run_at)
WHERE name = :name

-- name: schedules_delete
DELETE FROM schedules WHERE name = :name

-- name: schedule_fire
-- Compare-and-set on next_run_at: of several schedulers that read the same due tick, exactly one
-- update matches (writes are serialised), and only that caller inserts the tick's job, in the
-- same transaction. last_run_at is the tick the job is for (after downtime the latest missed
-- one), not the stored due_at the set compared. The set also compares the definition the scheduler
-- read (read_*): an operator's change between its read and this fire that kept the next tick (a new
-- cron with the same next tick, a new task or payload) would otherwise fire a job of the old
-- definition and store a next tick of the old cron.
UPDATE schedules
SET next_run_at = :next_run_at_after, last_run_at = :last_run_at
WHERE name = :name AND paused = 0 AND next_run_at = :due_at
  AND cron = :read_cron AND task = :read_task AND queue = :read_queue
  AND payload = :read_payload AND priority = :read_priority

-- name: schedule_move
-- The same compare-and-set on next_run_at, firing nothing: a next tick stored by a clock that was
-- ahead is moved back. Writes are serialised, so of the fires and moves of one stored tick exactly
-- one matches: a tick is never both moved and fired, nor moved twice. The tick it moves to was worked
-- out from the cron read, so the definition read is compared as schedule_fire compares it.
UPDATE schedules
SET next_run_at = :next_run_at
WHERE name = :name AND paused = 0 AND next_run_at = :due_at
  AND cron = :read_cron AND task = :read_task AND queue = :read_queue
  AND payload = :read_payload AND priority = :read_priority

-- name: subscriptions_upsert
INSERT INTO subscriptions (topic, queue, task, filter)
VALUES (:topic, :queue, :task, :filter)
ON CONFLICT (topic, queue) DO UPDATE SET task = excluded.task, filter = excluded.filter

-- name: subscriptions_list
SELECT topic, queue, task, filter
FROM subscriptions
WHERE :topic IS NULL OR topic = :topic
ORDER BY topic, queue

-- name: subscriptions_delete
DELETE FROM subscriptions WHERE topic = :topic AND queue = :queue

-- name: queue_depth
-- Live depth of one queue from the three partial indexes that hold its rows by state, so no scan
-- of the jobs table.
SELECT (SELECT count(*) FROM jobs WHERE queue = :queue AND state = 'pending')
     + (SELECT count(*) FROM jobs WHERE queue = :queue AND state = 'scheduled')
     + (SELECT count(*) FROM jobs WHERE queue = :queue AND state = 'processing')

-- name: queue_keys_held
-- Which of a send's idempotency keys (a JSON array) are held at now: backpressure does not count
-- their sends (the insert answers the holder).
SELECT key FROM idempotency_keys
WHERE queue = :queue AND key IN (SELECT value FROM json_each(:keys))
  AND (expires_at IS NULL OR expires_at > :now)

-- name: queue_drained
-- Rows of one queue that ended in the window; the IN list lets archive_queue_state_finished seek
-- once per terminal state instead of scanning the queue's history.
SELECT count(*) FROM archive
WHERE queue = :queue
  AND state IN ('completed', 'dead', 'expired', 'cancelled')
  AND finished_at >= :since AND finished_at <= :now

-- name: archive_prune
-- Retention: each row's cutoff is its queue's (from the JSON maps of queue -> microseconds) or
-- the default, dead letters having their own. The outer finished_at bound (the latest cutoff of
-- all) lets the scan walk archive_finished from the oldest row and stop early.
DELETE FROM archive
WHERE rowid IN (
    SELECT a.rowid
    FROM archive AS a
    LEFT JOIN json_each(:before) AS b ON b.key = a.queue
    LEFT JOIN json_each(:dead_before) AS d ON d.key = a.queue
    WHERE a.finished_at < :latest_cutoff
      AND a.finished_at < CASE
          WHEN a.state = 'dead' THEN coalesce(d.value / 1000000.0, :default_dead_before)
          ELSE coalesce(b.value / 1000000.0, :default_before)
      END
    ORDER BY a.finished_at
    LIMIT :limit
)

-- name: tokens_insert
-- A taken name or id inserts nothing (RETURNING then yields no row): names are unique for ever.
INSERT INTO tokens (id, name, role, queues, secret_hash, created_at, expires_at, revoked_at)
VALUES (:id, :name, :role, :queues, :secret_hash, :created_at, :expires_at, NULL)
ON CONFLICT DO NOTHING
RETURNING id

-- name: token_get
SELECT id, name, role, queues, secret_hash, created_at, expires_at, revoked_at
FROM tokens
WHERE id = :id

-- name: tokens_list
SELECT id, name, role, queues, secret_hash, created_at, expires_at, revoked_at
FROM tokens
ORDER BY name

-- name: tokens_revoke
UPDATE tokens SET revoked_at = :now
WHERE name = :name AND revoked_at IS NULL

-- name: task_totals
SELECT queue, task, completed, dead, expired, cancelled
FROM queue_counters
WHERE :queue IS NULL OR queue = :queue
ORDER BY queue, task

-- name: workers_beat
INSERT INTO workers (id, host, pid, queues, concurrency, started_at, last_seen)
VALUES (:id, :host, :pid, :queues, :concurrency, :started_at, :now)
ON CONFLICT (id) DO UPDATE SET
    last_seen = max(last_seen, excluded.last_seen), queues = excluded.queues, concurrency = excluded.concurrency

-- name: workers_remove
DELETE FROM workers WHERE id = :id

-- name: workers_list
-- Each worker with the jobs it holds leases on (its processing rows, through jobs_lease).
SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_seen,
       (SELECT json_group_array(j.id) FROM (
            SELECT id FROM jobs WHERE state = 'processing' AND worker_id = w.id ORDER BY id
        ) AS j) AS in_flight
FROM workers AS w
WHERE :seen_after IS NULL OR w.last_seen >= :seen_after
ORDER BY w.id

-- name: workers_prune
DELETE FROM workers WHERE last_seen < :before

-- name: alerts_list
SELECT rule, queue, state, since, value, threshold, message FROM alerts ORDER BY rule, queue

-- name: alerts_change
-- A state change; in BEGIN IMMEDIATE, so two evaluators cannot both make it.
UPDATE alerts SET state = :state, since = :since, value = :value, threshold = :threshold,
                  message = :message, updated_at = :now
WHERE rule = :rule AND queue = :queue AND state <> :state

-- name: alerts_fire_new
INSERT INTO alerts (rule, queue, state, since, value, threshold, message, updated_at)
VALUES (:rule, :queue, :state, :since, :value, :threshold, :message, :now)
ON CONFLICT (rule, queue) DO NOTHING

-- name: alerts_refresh
UPDATE alerts SET value = :value, threshold = :threshold, message = :message, updated_at = :now
WHERE rule = :rule AND queue = :queue AND state = :state
