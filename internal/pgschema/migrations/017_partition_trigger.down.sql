-- Back to the stored generated column (migration 2's expression, with the
-- count of partitions read back from the leases). PostgreSQL cannot make a
-- plain column generated again: the column is dropped and added, which
-- rewrites the table under an exclusive lock and recomputes every value
-- (the same values); the column is then the table's last.
LOCK TABLE {{table}} IN ACCESS EXCLUSIVE MODE;
DROP TRIGGER {{partition_trg}} ON {{table}};
DROP FUNCTION {{partition_fn}}();
ALTER TABLE {{table}} DROP COLUMN partition;
DO $do$
BEGIN
    EXECUTE format('ALTER TABLE %s ADD COLUMN partition integer
    GENERATED ALWAYS AS (((hashtextextended(aggregateid, 0) & 9223372036854775807) %% %s)::integer) STORED',
        {{table_literal}}, (SELECT count(*) FROM {{leases}}));
END
$do$;
