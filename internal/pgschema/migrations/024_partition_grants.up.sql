-- Time partitions with separated roles (docs/security.md): a default
-- partition the maintenance makes again (after it was dropped) gets the
-- SELECT and DELETE rights that roles other than the owner hold on the
-- outbox table, as `outbox grants` gives them on the default partition:
-- the relay's cleanup deletes there directly, and needs no new run of
-- `outbox grants`. The function keeps running as its owner (version 19).
CREATE OR REPLACE FUNCTION {{time_parts_fn}}(p_keep_for interval, p_lock_timeout text, p_actor text)
RETURNS TABLE (action text, partition_name text, detail text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    u        text;
    n_ahead  integer;
    fmt      text;
    lo       timestamp;
    pname    text;
    r        record;
    pending  bigint;
    newest   timestamptz;
    v_kept    jsonb := '[]'::jsonb;
    v_blocked jsonb := '[]'::jsonb;
    g         record;
BEGIN
    SELECT t.unit, t.ahead INTO u, n_ahead FROM {{time_parts}} t;
    IF u IS NULL OR NOT pg_try_advisory_xact_lock(hashtextextended({{time_parts_lock}}, 0)) THEN
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    fmt := CASE u WHEN 'day' THEN 'YYYYMMDD' ELSE 'YYYYMMDDHH24' END;

    IF NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                   WHERE i.inhparent = {{table_literal}}::regclass AND c.relpartbound IS NOT NULL
                     AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT') THEN
        BEGIN
            EXECUTE 'CREATE TABLE {{time_parts_default}} PARTITION OF {{table}} DEFAULT';
            -- The roles that read or delete the outbox's rows may read or
            -- delete them here too, as `outbox grants` gave them on the
            -- partition dropped before (the relay cleans it up directly).
            FOR g IN
                SELECT DISTINCT a.privilege_type, a.grantee
                FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
                WHERE c.oid = {{table_literal}}::regclass AND a.grantee <> c.relowner
                  AND a.privilege_type IN ('SELECT', 'DELETE')
                ORDER BY 1, 2
            LOOP
                EXECUTE format('GRANT %s ON TABLE {{time_parts_default}} TO %s', g.privilege_type,
                    CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
            END LOOP;
            action := 'created'; partition_name := {{time_parts_default_name}}; detail := 'default partition';
            RETURN NEXT;
        EXCEPTION WHEN lock_not_available THEN
            action := 'busy'; partition_name := {{time_parts_default_name}}; detail := SQLERRM;
            RETURN NEXT;
        END;
    END IF;

    -- Ranges are UTC units; lo is a timestamp without time zone in UTC,
    -- so that a session's time zone and its daylight saving never move a
    -- bound.
    lo := date_trunc(u, clock_timestamp() AT TIME ZONE 'UTC');
    FOR i IN 0..n_ahead LOOP
        pname := {{table_name_literal}} || '_p' || to_char(lo, fmt);
        IF to_regclass(format('%I.%I', {{schema_name_literal}}, pname)) IS NULL THEN
            BEGIN
                EXECUTE format('CREATE TABLE %I.%I PARTITION OF {{table}} FOR VALUES FROM (%L) TO (%L)',
                    {{schema_name_literal}}, pname, lo AT TIME ZONE 'UTC', (lo + ('1 ' || u)::interval) AT TIME ZONE 'UTC');
                action := 'created'; partition_name := pname; detail := '';
                RETURN NEXT;
            EXCEPTION
                WHEN check_violation THEN
                    -- The default partition holds rows of this range (a
                    -- writer's clock ahead, or maintenance that did not run
                    -- for a long time): they stay there, and are deleted
                    -- once published (docs/retention.md).
                    v_blocked := v_blocked || jsonb_build_object('partition', pname, 'reason', SQLERRM);
                    action := 'blocked'; partition_name := pname; detail := SQLERRM;
                    RETURN NEXT;
                WHEN lock_not_available THEN
                    action := 'busy'; partition_name := pname; detail := SQLERRM;
                    RETURN NEXT;
            END;
        END IF;
        lo := lo + ('1 ' || u)::interval;
    END LOOP;

    IF p_keep_for IS NOT NULL THEN
        FOR r IN
            SELECT c.relname, b.upper
            FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            CROSS JOIN LATERAL (SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz AS upper) b
            WHERE i.inhparent = {{table_literal}}::regclass AND b.upper IS NOT NULL
              AND b.upper <= clock_timestamp() - p_keep_for
            ORDER BY b.upper
        LOOP
            BEGIN
                EXECUTE format('ALTER TABLE {{table}} DETACH PARTITION %I.%I', {{schema_name_literal}}, r.relname);
                EXECUTE format('SELECT count(*) FROM %I.%I WHERE published_at IS NULL', {{schema_name_literal}}, r.relname) INTO pending;
                EXECUTE format('SELECT max(published_at) FROM %I.%I WHERE published_at IS NOT NULL', {{schema_name_literal}}, r.relname) INTO newest;
                IF pending > 0 THEN
                    RAISE EXCEPTION 'partition % holds % unpublished event(s)', r.relname, pending USING ERRCODE = 'OBX01';
                END IF;
                IF newest > clock_timestamp() - p_keep_for THEN
                    RAISE EXCEPTION 'partition % holds events published within the window', r.relname USING ERRCODE = 'OBX02';
                END IF;
                EXECUTE format('DROP TABLE %I.%I', {{schema_name_literal}}, r.relname);
                INSERT INTO {{audit}} (actor, action, detail)
                VALUES (p_actor, 'partition-drop', format('dropped time partition %s (range up to %s)', r.relname, r.upper));
                action := 'dropped'; partition_name := r.relname; detail := '';
                RETURN NEXT;
            EXCEPTION
                WHEN SQLSTATE 'OBX01' THEN
                    v_kept := v_kept || jsonb_build_object('partition', r.relname, 'unpublished', pending);
                    action := 'kept'; partition_name := r.relname; detail := SQLERRM;
                    RETURN NEXT;
                WHEN SQLSTATE 'OBX02' THEN
                    action := 'waiting'; partition_name := r.relname; detail := SQLERRM;
                    RETURN NEXT;
                WHEN lock_not_available THEN
                    action := 'busy'; partition_name := r.relname; detail := SQLERRM;
                    RETURN NEXT;
            END;
        END LOOP;
    END IF;

    UPDATE {{time_parts}} SET maintained_at = clock_timestamp(), kept = v_kept, blocked = v_blocked;
END
$fn$;
