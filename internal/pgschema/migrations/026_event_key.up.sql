-- Event ids are unique again (docs/databases.md, event ids). Schema
-- version 10 dropped the key on id to make inserts cheaper; then a second
-- event written with an id the table held was accepted, published under
-- the same id (a consumer de-duplicating by id dropped it without a word,
-- though its payload differed), and of two such events dead-lettered only
-- one was kept. The table refuses such an event again: the writer's
-- INSERT fails and names the id.
--
-- A key on a large table is built under a lock that makes writers wait.
-- To build it without, make the index first, concurrently, under this
-- name; this migration then turns it into the key at once:
--   CREATE UNIQUE INDEX CONCURRENTLY <table>_id ON <table> (id);
--
-- Rows that share an id stop the migration with their count and one of
-- their ids: which of them is the event is the writer's call, not ours.
--
-- A table partitioned by time (migration 13) cannot hold a key on id alone:
-- a key of a partitioned table must hold created_at. Its ids are not
-- checked by the table (docs/retention.md).
DO $do$
DECLARE
    dup  text;
    n    bigint;
    rel  regclass := {{table_literal}}::regclass;
    idx  regclass := to_regclass({{id_idx_q_literal}});
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = rel) = 'p'
       OR EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = rel AND contype = 'p') THEN
        RETURN;
    END IF;
    SELECT d.id::text, count(*) OVER () INTO dup, n
    FROM (SELECT id FROM {{table}} GROUP BY id HAVING count(*) > 1) AS d LIMIT 1;
    IF dup IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: % event id(s) are held by more than one row of %, for example %: the table cannot refuse a second event with one id until each id is held once', n, rel, dup
            USING HINT = 'SELECT id, seq, aggregatetype, aggregateid, type FROM ' || rel || ' WHERE id IN (SELECT id FROM ' || rel || ' GROUP BY id HAVING count(*) > 1) ORDER BY id, seq; then give each copy that is an event of its own a new id, or delete the copies that are not (docs/databases.md, event ids)';
    END IF;
    IF idx IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I', rel, {{table_name_literal}} || '_pkey', {{table_name_literal}} || '_id');
    ELSE
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (id)', rel, {{table_name_literal}} || '_pkey');
    END IF;
END
$do$;
