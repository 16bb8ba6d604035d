CREATE OR REPLACE FUNCTION {{cdc_write_fn}}(p_id uuid[], p_at text[], p_aid text[], p_ty text[], p_p text[], p_raw bytea[], p_h text[], p_tc text[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    rows tid[];
    one  tid;
BEGIN
    IF cardinality(p_id) = 1 THEN
        INSERT INTO {{table}} (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)
        VALUES (p_id[1], p_at[1], p_aid[1], p_ty[1], p_p[1]::json, p_raw[1], coalesce(p_h[1]::jsonb, '{}'::jsonb), p_tc[1])
        RETURNING ctid INTO one;
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
DROP FUNCTION IF EXISTS {{cdc_emit_fn}}(text[]);
DROP FUNCTION IF EXISTS {{cdc_slot_fn}}();
