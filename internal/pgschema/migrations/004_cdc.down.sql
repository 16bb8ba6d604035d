-- Dropping the table's log tailing drops the replication slots and
-- publications the relay created for it: an orphaned slot would keep
-- every WAL segment from now on.
DO $do$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT slot, publication FROM {{cdc}} LOOP
        IF EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = r.slot AND active) THEN
            RAISE EXCEPTION 'replication slot % is in use: stop the relay that streams it (outbox relay --source cdc) first', r.slot
                USING ERRCODE = '55006';
        END IF;
        PERFORM pg_drop_replication_slot(slot_name) FROM pg_replication_slots
        WHERE slot_name = r.slot AND database = current_database();
        EXECUTE format('DROP PUBLICATION IF EXISTS %I', r.publication);
    END LOOP;
END
$do$;
DROP FUNCTION IF EXISTS {{cdc_mark_fn}}(uuid[], bigint[], boolean);
DROP FUNCTION IF EXISTS {{cdc_write_fn}}(uuid[], text[], text[], text[], text[], bytea[], text[], text[]);
DROP FUNCTION IF EXISTS {{cdc_fence_fn}}(text, text, bigint, pg_lsn, pg_lsn);
DROP TABLE IF EXISTS {{cdc}};
