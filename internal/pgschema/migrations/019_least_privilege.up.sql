-- Least privilege (docs/security.md): each database role may do its job
-- and nothing else, and the audit is append-only by privilege.
--
-- Until now the audit's guard let a DELETE through whenever the session
-- had set outbox.audit_prune to on, which any role that could write the
-- table could do. Now no setting opens anything: the guard refuses UPDATE,
-- DELETE and TRUNCATE to every role, and lets through only the DELETE of
-- the prune function below when it runs as the audit table's owner. The
-- prune function runs as its owner (SECURITY DEFINER), which is the
-- table's owner, and only roles granted EXECUTE on it may call it: no
-- other role needs, or gets, any right to change the audit. The owner
-- could drop the guard; for the owner it is a guard against mistakes,
-- for everyone else privilege is the boundary.
CREATE OR REPLACE FUNCTION {{audit_guard_fn}}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    stack text;
BEGIN
    -- The prune function's DELETE: it runs as the table's owner, and its
    -- frame is on the stack. The stack names it by its signature, spelled
    -- with its schema under this search_path as under the function's own
    -- (the words around it follow lc_messages; the signature does not).
    IF TG_OP = 'DELETE'
       AND current_user = (SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = TG_RELID) THEN
        GET DIAGNOSTICS stack = PG_CONTEXT;
        IF position(' ' || {{audit_prune_sig}}::regprocedure::text || ' ' IN stack) > 0 THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'the audit table % is append-only: % refused (old rows are removed with `outbox audit prune --before TIME`, as the table''s owner)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'P0001';
END
$fn$;

-- Deletes the audit rows older than p_before and records it: who asked
-- (p_actor, p_role, p_reason, and the database role of the session), how
-- many rows went and before when. It runs as its owner, the audit table's
-- owner; EXECUTE is granted to no one else (`outbox grants` grants it to
-- the owner role).
CREATE OR REPLACE FUNCTION {{audit_prune_fn}}(p_before timestamptz, p_actor text, p_role text, p_reason text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n bigint;
BEGIN
    IF p_before IS NULL THEN
        RAISE EXCEPTION 'audit prune: no time given: rows older than it are deleted' USING ERRCODE = '22004';
    END IF;
    DELETE FROM {{audit}} WHERE at < p_before;
    GET DIAGNOSTICS n = ROW_COUNT;
    INSERT INTO {{audit}} (actor, role, action, detail, reason)
    VALUES (p_actor, p_role, 'audit-prune',
            format('deleted %s rows older than %s (database role %s)', n, p_before, session_user), p_reason);
    RETURN n;
END
$fn$;
REVOKE EXECUTE ON FUNCTION {{audit_prune_fn}}(timestamptz, text, text, text) FROM PUBLIC;
REVOKE UPDATE, DELETE, TRUNCATE ON {{audit}} FROM PUBLIC;

-- The prune runs as the audit table's owner: its owner must be that role
-- (the role that migrated owns both, unless ownership was moved since).
DO $do$
DECLARE
    o name := (SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
               WHERE c.oid = {{audit_literal}}::regclass);
BEGIN
    IF o <> (SELECT r.rolname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
             WHERE p.oid = {{audit_prune_sig}}::regprocedure) THEN
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', {{audit_prune_sig}}::regprocedure, o);
    END IF;
END
$do$;

-- Insert + delete mode: writers call this function, which inserts their
-- events and deletes them again. It runs as its owner, so that a writer
-- needs EXECUTE on it and no right to delete events.
ALTER FUNCTION {{cdc_write_fn}}(uuid[], text[], text[], text[], text[], bytea[], text[], text[])
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION {{cdc_write_fn}}(uuid[], text[], text[], text[], text[], bytea[], text[], text[]) FROM PUBLIC;

-- Time partitions (docs/retention.md): making and dropping partitions is
-- the owner's DDL; the relay (and `outbox retention`) call this function,
-- which does it as its owner, and need EXECUTE on it only.
ALTER FUNCTION {{time_parts_fn}}(interval, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION {{time_parts_fn}}(interval, text, text) FROM PUBLIC;
