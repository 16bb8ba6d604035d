-- The trigger of migration 17 again, and the partition of every row
-- written since migration 18 (the trigger sets it on the UPDATE below).
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
CREATE TRIGGER {{partition_trg}} BEFORE INSERT OR UPDATE OF aggregateid, partition ON {{table}}
    FOR EACH ROW EXECUTE FUNCTION {{partition_fn}}();
ALTER TABLE {{table}} ENABLE ALWAYS TRIGGER {{partition_trg}};
UPDATE {{table}} SET partition = NULL WHERE partition IS NULL;
