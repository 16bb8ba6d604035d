-- Log tailing's write modes that cannot lose silently (docs/cdc.md): an
-- event written as a logical decoding message, or as a row deleted again
-- at once, exists only in the WAL, and a relay reads it only through a
-- replication slot that existed when it was written. Without one, the
-- event is gone at the commit, and nothing says so. So the writers of those
-- modes go through functions that refuse to write while no slot of the
-- table's (a row of _cdc whose slot exists and has not lost its WAL) is
-- there, with the hint 'outbox-no-slot'.
--
-- The check reads pg_replication_slots (a scan of the server's few slots
-- in shared memory) and _cdc (a row per slot) in the writer's statement:
-- no extra round trip, and no window in which a cached answer is stale.

-- Refuses, unless a slot of the table's exists.
CREATE FUNCTION {{cdc_slot_fn}}() RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM {{cdc}} c
        JOIN pg_replication_slots s ON s.slot_name = c.slot AND s.database = current_database()
        WHERE s.wal_status IS DISTINCT FROM 'lost') THEN
        RAISE EXCEPTION 'outbox: no replication slot relays %: an event written in message or insert + delete mode now would be lost, so none is written; create the slot with `outbox migrate --cdc`, or start a relay with --source cdc, first', {{table_literal}}
            USING ERRCODE = 'P0001', HINT = 'outbox-no-slot';
    END IF;
END
$fn$;
REVOKE EXECUTE ON FUNCTION {{cdc_slot_fn}}() FROM PUBLIC;

-- Message mode: emits each content as one transactional logical decoding
-- message with the table's prefix, in order, once the check passed.
CREATE FUNCTION {{cdc_emit_fn}}(p_contents text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM {{cdc_slot_fn}}();
    IF cardinality(p_contents) = 1 THEN
        PERFORM pg_logical_emit_message(true, {{message_prefix}}, p_contents[1]);
        RETURN;
    END IF;
    PERFORM pg_logical_emit_message(true, {{message_prefix}}, m.c)
    FROM unnest(p_contents) WITH ORDINALITY AS m(c, i) ORDER BY m.i;
END
$fn$;
REVOKE EXECUTE ON FUNCTION {{cdc_emit_fn}}(text[]) FROM PUBLIC;

-- Insert + delete mode: as in version 16, once the check passed.
CREATE OR REPLACE FUNCTION {{cdc_write_fn}}(p_id uuid[], p_at text[], p_aid text[], p_ty text[], p_p text[], p_raw bytea[], p_h text[], p_tc text[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    rows tid[];
    one  tid;
BEGIN
    PERFORM {{cdc_slot_fn}}();
    IF cardinality(p_id) = 1 THEN
        INSERT INTO {{table}} (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)
        VALUES (p_id[1], p_at[1], p_aid[1], p_ty[1], p_p[1]::json, p_raw[1], coalesce(p_h[1]::jsonb, '{}'::jsonb), p_tc[1])
        RETURNING ctid INTO one;
        -- A ctid names a row only within one partition: the id makes sure
        -- it is this row.
        DELETE FROM {{table}} WHERE ctid = one AND id = p_id[1];
        RETURN;
    END IF;
    WITH i AS (
        INSERT INTO {{table}} (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)
        SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.raw, coalesce(u.h::jsonb, '{}'::jsonb), u.tc
        FROM unnest(p_id, p_at, p_aid, p_ty, p_p, p_raw, p_h, p_tc) WITH ORDINALITY AS u(id, at, aid, ty, p, raw, h, tc, i)
        ORDER BY u.i
        RETURNING ctid)
    SELECT array_agg(ctid) INTO rows FROM i;
    DELETE FROM {{table}} WHERE ctid = ANY (rows) AND id = ANY (p_id);
END
$fn$;
