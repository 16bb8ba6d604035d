-- A leaner outbox row (docs/benchmarks.md, A leaner outbox row): every
-- index is written by every INSERT, and two of the three served no query
-- of the write path's cycle that could not use another.
--
-- The primary key on id goes: the relay claims, records and retries rows
-- by seq through the pending index, and nothing else looks an outbox row
-- up by id on a hot path. Event ids stay unique where they are made: the
-- writers generate them (UUIDv7), and consumers de-duplicate by id, so a
-- row written twice with one id is a duplicate explained by its id (G5),
-- never a lost event. The dead-letter table keeps its key on id.
--
-- The (partition, seq) index goes: claims read the pending index in seq
-- order and filter their partitions, and the floors (outboxpgx) are found
-- from the pending index too.
--
-- Dropping is quick and loses nothing: every pending row stays where it
-- is, with its seq, and keeps its place in the claim's order.
DO $do$
DECLARE
    pk text;
BEGIN
    SELECT conname INTO pk FROM pg_constraint
    WHERE conrelid = {{table_literal}}::regclass AND contype = 'p';
    IF pk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {{table_literal}}, pk);
    END IF;
END
$do$;
DROP INDEX IF EXISTS {{by_part_idx_q}};

-- Insert + delete: the rows are deleted by their place in the table, which
-- needs no index.
CREATE OR REPLACE FUNCTION {{cdc_write_fn}}(p_id uuid[], p_at text[], p_aid text[], p_ty text[], p_p text[], p_raw bytea[], p_h text[], p_tc text[])
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    rows tid[];
BEGIN
    WITH i AS (
        INSERT INTO {{table}} (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)
        SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.raw, coalesce(u.h::jsonb, '{}'::jsonb), u.tc
        FROM unnest(p_id, p_at, p_aid, p_ty, p_p, p_raw, p_h, p_tc) WITH ORDINALITY AS u(id, at, aid, ty, p, raw, h, tc, i)
        ORDER BY u.i
        RETURNING ctid)
    SELECT array_agg(ctid) INTO rows FROM i;
    DELETE FROM {{table}} WHERE ctid = ANY (rows);
END
$fn$;

-- cdc_mark_fn by seq: the rows are found through the pending index (p_ids
-- and p_seqs name the same rows, pairwise). The three-argument form stays
-- for relays of an earlier version, and reads the table to find its rows.
CREATE FUNCTION {{cdc_mark_fn}}(p_ids uuid[], p_xids bigint[], p_keep boolean, p_seqs bigint[]) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    -- Taken before the statement below takes its own: a transaction this
    -- one sees, that one sees too.
    snap pg_snapshot := pg_current_snapshot();
    top  bigint;
    done uuid[];
BEGIN
    top := pg_snapshot_xmax(snap)::text::bigint;
    IF p_keep THEN
        WITH u AS (UPDATE {{table}} SET published_at = clock_timestamp(), last_error = NULL, next_attempt_at = NULL
                   WHERE seq = ANY (p_seqs) AND published_at IS NULL AND id = ANY (p_ids) RETURNING id)
        SELECT coalesce(array_agg(id), '{}') INTO done FROM u;
    ELSE
        WITH d AS (DELETE FROM {{table}} WHERE seq = ANY (p_seqs) AND published_at IS NULL AND id = ANY (p_ids) RETURNING id)
        SELECT coalesce(array_agg(id), '{}') INTO done FROM d;
    END IF;
    IF cardinality(done) < cardinality(p_ids) AND EXISTS (
        SELECT 1 FROM unnest(p_ids, p_xids) AS m(id, x)
        WHERE m.x <> 0 AND m.id <> ALL (done)
          AND NOT pg_visible_in_snapshot((CASE
                  WHEN (((top >> 32) << 32) | m.x) < top THEN ((top >> 32) << 32) | m.x
                  ELSE (((top >> 32) - 1) << 32) | m.x END)::text::xid8, snap)) THEN
        RAISE EXCEPTION 'outbox: rows of a transaction the stream sent are not visible yet'
            USING ERRCODE = 'P0001', HINT = 'outbox-not-visible';
    END IF;
END
$fn$;
