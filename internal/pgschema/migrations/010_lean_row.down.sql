-- Back to the uuid primary key and the (partition, seq) index. Rows that
-- repeat an event id held by an earlier row are removed first (the
-- earlier row carries that event; consumers would drop the copy as a
-- duplicate): a primary key allows one row per id.
DO $do$
DECLARE
    n bigint;
BEGIN
    DELETE FROM {{table}} AS o USING {{table}} AS e
    WHERE e.id = o.id AND (e.seq < o.seq OR (e.seq = o.seq AND e.ctid < o.ctid));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        RAISE NOTICE 'outbox: removed % rows that repeated the event id of an earlier row', n;
    END IF;
END
$do$;
DROP FUNCTION IF EXISTS {{cdc_mark_fn}}(uuid[], bigint[], boolean, bigint[]);
CREATE OR REPLACE FUNCTION {{cdc_write_fn}}(p_id uuid[], p_at text[], p_aid text[], p_ty text[], p_p text[], p_raw bytea[], p_h text[], p_tc text[])
RETURNS void LANGUAGE sql AS $fn$
INSERT INTO {{table}} (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)
SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.raw, coalesce(u.h::jsonb, '{}'::jsonb), u.tc
FROM unnest(p_id, p_at, p_aid, p_ty, p_p, p_raw, p_h, p_tc) WITH ORDINALITY AS u(id, at, aid, ty, p, raw, h, tc, i)
ORDER BY u.i;
DELETE FROM {{table}} WHERE id = ANY (p_id);
$fn$;
CREATE INDEX {{by_part_idx}} ON {{table}} (partition, seq) WHERE published_at IS NULL;
-- A table partitioned by time (migration 13) never had the key: a key
-- of a partitioned table must hold created_at.
DO $do$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = {{table_literal}}::regclass) <> 'p' THEN
        ALTER TABLE {{table}} ADD PRIMARY KEY (id);
    END IF;
END
$do$;
