-- Back to version 18: the functions run as their caller and every role
-- may execute them again, and the audit's guard lets a DELETE through
-- where outbox.audit_prune is on (the guard and the prune of version 7).
-- Rights granted to roles (outbox grants) stay as they are.
ALTER FUNCTION {{time_parts_fn}}(interval, text, text) SECURITY INVOKER RESET search_path;
GRANT EXECUTE ON FUNCTION {{time_parts_fn}}(interval, text, text) TO PUBLIC;
ALTER FUNCTION {{cdc_write_fn}}(uuid[], text[], text[], text[], text[], bytea[], text[], text[]) SECURITY INVOKER RESET search_path;
GRANT EXECUTE ON FUNCTION {{cdc_write_fn}}(uuid[], text[], text[], text[], text[], bytea[], text[], text[]) TO PUBLIC;

CREATE OR REPLACE FUNCTION {{audit_prune_fn}}(p_before timestamptz, p_actor text, p_role text, p_reason text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    n bigint;
BEGIN
    PERFORM set_config('outbox.audit_prune', 'on', true);
    DELETE FROM {{audit}} WHERE at < p_before;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('outbox.audit_prune', 'off', true);
    INSERT INTO {{audit}} (actor, role, action, detail, reason)
    VALUES (p_actor, p_role, 'audit-prune', format('deleted %s rows older than %s', n, p_before), p_reason);
    RETURN n;
END
$fn$;
GRANT EXECUTE ON FUNCTION {{audit_prune_fn}}(timestamptz, text, text, text) TO PUBLIC;

CREATE OR REPLACE FUNCTION {{audit_guard_fn}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('outbox.audit_prune', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit table % is append-only: % refused (old rows are removed with `outbox audit prune --before TIME`)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'P0001';
END
$fn$;
