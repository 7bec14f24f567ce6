-- Conveyor schema, version 5: scheduled jobs (run_at in the future when written) leave the ready index.
--
-- A pending job whose run_at was still ahead sat in jobs_ready_idx (queue, priority DESC, run_at, id)
-- among the ready ones. An acquire that found fewer ready jobs than it asked for (every idle poll, every
-- pickup, the end of every drain) walked the index to its end, over every scheduled job of the queue:
-- 85 ms and 7,146 buffers for one idle acquire with 1,000,000 scheduled jobs in the queue (run_at is a
-- filter there, not a bound, because priority comes first). Such a job is now 'scheduled': it waits in
-- jobs_scheduled_idx, ordered by run_at, and the backend makes it 'pending' once it is due
-- (jobs_promote, a range scan of the due ones) before it acquires. Rows written by an older release as
-- pending with a future run_at are still acquired when due, through the old filter; this migration
-- moves those present now.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('pending', 'scheduled', 'processing'));

CREATE INDEX jobs_scheduled_idx ON jobs (queue, run_at) WHERE state = 'scheduled';

UPDATE jobs SET state = 'scheduled' WHERE state = 'pending' AND run_at > now();
