-- Conveyor schema, version 2: how many times a job's lease expired (rescue returned it because its
-- worker died or hung while holding it, running it or only prefetching it).
--
-- Deliveries are counted when their outcome is written, so a worker that dies charges none of the jobs
-- it held. A job that was ever rescued is a suspect: each of its later starts is counted before its
-- handler runs, so a job that kills its workers still reaches max_deliveries. Adding a column with a
-- constant default rewrites nothing (PostgreSQL 11+); the archive's partitions get it from the parent.
ALTER TABLE jobs ADD COLUMN rescues integer NOT NULL DEFAULT 0;
ALTER TABLE archive ADD COLUMN rescues integer NOT NULL DEFAULT 0;
