-- The partition of a row is set by a row trigger instead of a stored
-- generated column. Same value, same column, same readers: the trigger
-- computes it from aggregateid on every INSERT and on every UPDATE of
-- aggregateid or partition, so no writer (WriteTx of any version, plain
-- SQL with Debezium's five columns) supplies it and none can set it wrong.
-- Why: PostgreSQL builds a stored generated column's expression anew for
-- every statement it runs: a single-row insert took 14–15 µs of server
-- time with it and 10–11 with the trigger (docs/benchmarks.md); ten rows
-- in one statement cost the same either way. Existing values stay:
-- dropping the expression rewrites nothing.
--
-- The count of partitions was fixed when the table was made (migration
-- 2): it is read back from the leases, one row per partition.
LOCK TABLE {{table}} IN ACCESS EXCLUSIVE MODE;
DO $do$
DECLARE
    n integer := (SELECT count(*) FROM {{leases}});
BEGIN
    IF n < 1 THEN
        RAISE EXCEPTION 'outbox: % has no partitions to hash rows into (its leases are empty)', {{table_literal}};
    END IF;
    EXECUTE format($f$
CREATE FUNCTION {{partition_fn}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.partition := ((hashtextextended(NEW.aggregateid, 0) & 9223372036854775807) %% %s)::integer;
    RETURN NEW;
END
$fn$$f$, n);
END
$do$;
ALTER TABLE {{table}} ALTER COLUMN partition DROP EXPRESSION;
CREATE TRIGGER {{partition_trg}} BEFORE INSERT OR UPDATE OF aggregateid, partition ON {{table}}
    FOR EACH ROW EXECUTE FUNCTION {{partition_fn}}();
-- Also under session_replication_role = replica (a restore, a replication
-- apply worker, a writer that set it), as the generated column was.
ALTER TABLE {{table}} ENABLE ALWAYS TRIGGER {{partition_trg}};
