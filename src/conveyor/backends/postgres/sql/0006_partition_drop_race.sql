-- Conveyor schema, version 6: two pruners dropping the same archive partition.
--
-- conveyor_archive_partition_drop (0001) looked the partition up before it took the partitions'
-- advisory lock. Every worker runs a pruner, so two could find the same daily partition due: the first
-- dropped it while the second waited for the lock, and the second then counted the rows of a table
-- that no longer existed ("relation does not exist": a BackendError in its pruner, one of the failures
-- in a row that stop a worker). Now the lock comes first and a partition already gone counts 0 rows
-- (another pruner dropped it); a name that is not an archive partition is still an error.
CREATE OR REPLACE FUNCTION conveyor_archive_partition_drop(part text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF part !~ '^archive_p[0-9]{8}$' THEN
        RAISE EXCEPTION 'not an archive partition: %', part;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('conveyor.archive_partitions', 0));
    PERFORM set_config('lock_timeout', '1s', true);
    IF to_regclass(quote_ident(part)) IS NULL THEN
        RETURN 0;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_inherits
        WHERE inhparent = 'archive'::regclass AND inhrelid = to_regclass(quote_ident(part))
    ) THEN
        RAISE EXCEPTION 'not an archive partition: %', part;
    END IF;
    EXECUTE format('SELECT count(*) FROM %I', part) INTO n;
    EXECUTE format('DROP TABLE %I', part);
    RETURN n;
END
$$;
