-- Conveyor schema, version 4: how many times a job's lease expired (rescue returned it because its
-- worker died or hung while holding it, running it or only prefetching it). A job that was ever
-- rescued is a suspect: each of its later starts is counted before its handler runs (the PostgreSQL
-- migration 0002_rescues.sql has the whole reason).
ALTER TABLE jobs ADD COLUMN rescues INTEGER NOT NULL DEFAULT 0;
ALTER TABLE archive ADD COLUMN rescues INTEGER NOT NULL DEFAULT 0;
