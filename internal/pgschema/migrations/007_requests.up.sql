-- Requests that need a second person (docs/console.md, Requests): a replay
-- of published events or the repair of a dead letter, proposed by one user,
-- approved or rejected by another, then carried out in batches. cursor is
-- the position (the original seq) up to which a replay has re-enqueued its
-- events, written in the same transaction as each batch, so an executor
-- that dies leaves the request resumable from there.
CREATE TABLE {{requests}} (
    id             uuid        PRIMARY KEY,
    kind           text        NOT NULL CHECK (kind IN ('replay', 'repair')),
    state          text        NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'approved', 'executing', 'done', 'failed', 'cancelled', 'rejected', 'expired')),
    requester      text        NOT NULL,
    requester_role text        NOT NULL,
    reason         text        NOT NULL,
    -- json, not jsonb: a repair's proposed payload is kept as written.
    params         json        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at     timestamptz NOT NULL,
    decided_by     text        NOT NULL DEFAULT '',
    decided_role   text        NOT NULL DEFAULT '',
    decided_at     timestamptz,
    decision_note  text        NOT NULL DEFAULT '',
    -- Execution: the executor holding the request, renewed with every
    -- batch; another may take over once heartbeat_at is older than the
    -- executor's lease. epoch grows with every take-over and fences a
    -- stale executor's batches.
    executor       text        NOT NULL DEFAULT '',
    epoch          bigint      NOT NULL DEFAULT 0,
    heartbeat_at   timestamptz,
    started_at     timestamptz,
    finished_at    timestamptz,
    total          bigint,
    done           bigint      NOT NULL DEFAULT 0,
    cursor         bigint      NOT NULL DEFAULT 0,
    error          text        NOT NULL DEFAULT ''
);
CREATE INDEX {{requests_idx}} ON {{requests}} (created_at);

-- The audit keeps what an action changed (a repair's payload and headers
-- before and after) and the request it belongs to.
ALTER TABLE {{audit}} ADD COLUMN before jsonb, ADD COLUMN after jsonb, ADD COLUMN request_id uuid;
CREATE INDEX {{audit_at_idx}} ON {{audit}} (at);

-- The audit is append-only: UPDATE, DELETE and TRUNCATE are refused,
-- except inside the prune function below (`outbox audit prune`), which
-- deletes rows older than a time and records that it did.
CREATE FUNCTION {{audit_guard_fn}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('outbox.audit_prune', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit table % is append-only: % refused (old rows are removed with `outbox audit prune --before TIME`)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'P0001';
END
$fn$;
CREATE TRIGGER {{audit_guard_trg}} BEFORE UPDATE OR DELETE ON {{audit}}
    FOR EACH ROW EXECUTE FUNCTION {{audit_guard_fn}}();
CREATE TRIGGER {{audit_guard_trunc_trg}} BEFORE TRUNCATE ON {{audit}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{audit_guard_fn}}();

CREATE FUNCTION {{audit_prune_fn}}(p_before timestamptz, p_actor text, p_role text, p_reason text) RETURNS bigint
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
