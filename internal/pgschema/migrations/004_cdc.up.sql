-- Log tailing (docs/cdc.md). One row per replication slot that relays this
-- table: the slot's streamer lease (one relay streams at a time; epoch grows
-- with every change of owner and fences a stale one), the publication the
-- relay created with it (so that dropping the table drops both), and what
-- the streamer recorded along the way.
CREATE TABLE {{cdc}} (
    slot          text        PRIMARY KEY,
    publication   text        NOT NULL,
    owner         text,
    epoch         bigint      NOT NULL DEFAULT 0,
    expires_at    timestamptz NOT NULL DEFAULT '-infinity',
    -- False from the moment the relay creates the slot until it has relayed
    -- the rows that were already in the table then (the slot's stream does
    -- not hold them).
    drained       boolean     NOT NULL DEFAULT false,
    -- The slot existed: a missing slot is then a lost one, not a new one.
    slot_created  boolean     NOT NULL DEFAULT false,
    -- The LSN up to which every event was acknowledged or dead-lettered, as
    -- last recorded by a streamer (the slot confirms it right after).
    confirmed_lsn pg_lsn,
    -- The end of the newest transaction that had an event dead-lettered: a
    -- streamer that replays the slot from before it skips events that are
    -- in the dead-letter table already.
    dead_lsn      pg_lsn      NOT NULL DEFAULT '0/0',
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Refuses the outcome of a streamer's batch unless it still holds the
-- slot's lease (by the database clock) at the epoch it streams under, and
-- records the LSN it is about to confirm.
CREATE FUNCTION {{cdc_fence_fn}}(p_slot text, p_relay text, p_epoch bigint, p_lsn pg_lsn, p_dead pg_lsn) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE {{cdc}}
    SET confirmed_lsn = CASE WHEN p_lsn IS NULL THEN confirmed_lsn
                             ELSE greatest(coalesce(confirmed_lsn, p_lsn), p_lsn) END,
        dead_lsn = greatest(dead_lsn, coalesce(p_dead, '0/0')),
        updated_at = now()
    WHERE slot = p_slot AND owner = p_relay AND epoch = p_epoch AND expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost: relay % no longer streams replication slot % at epoch %', p_relay, p_slot, p_epoch
            USING ERRCODE = 'P0001', HINT = 'outbox-lease-lost';
    END IF;
END
$fn$;

-- Insert + delete in one call, for writers in insert+delete mode
-- (docs/cdc.md): the event's INSERT reaches the WAL, and so the relay that
-- tails it, while the table stays empty.
CREATE FUNCTION {{cdc_write_fn}}(p_id uuid[], p_at text[], p_aid text[], p_ty text[], p_p text[], p_raw bytea[], p_h text[], p_tc text[])
RETURNS void LANGUAGE sql AS $fn$
INSERT INTO {{table}} (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)
SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.raw, coalesce(u.h::jsonb, '{}'::jsonb), u.tc
FROM unnest(p_id, p_at, p_aid, p_ty, p_p, p_raw, p_h, p_tc) WITH ORDINALITY AS u(id, at, aid, ty, p, raw, h, tc, i)
ORDER BY u.i;
DELETE FROM {{table}} WHERE id = ANY (p_id);
$fn$;

-- Records published rows (deletes them, or with p_keep marks them), or
-- removes dead-lettered ones, for a streamer: p_xids are the transactions
-- that inserted them (0: known visible). PostgreSQL sends a transaction to
-- the stream once its commit is in the WAL, a moment before other sessions
-- can see it: a row this statement cannot see yet is not skipped (it would
-- stay in the table for good, its event published) but refused, and the
-- streamer tries again. A row that is gone (insert+delete) is fine.
CREATE FUNCTION {{cdc_mark_fn}}(p_ids uuid[], p_xids bigint[], p_keep boolean) RETURNS void
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
                   WHERE id = ANY (p_ids) RETURNING id)
        SELECT coalesce(array_agg(id), '{}') INTO done FROM u;
    ELSE
        WITH d AS (DELETE FROM {{table}} WHERE id = ANY (p_ids) RETURNING id)
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
