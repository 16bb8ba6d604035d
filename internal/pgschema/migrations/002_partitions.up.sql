-- Partitions: every aggregate hashes, in the database, into one of a fixed
-- number of partitions, so rows inserted by plain SQL get theirs too. A
-- partition is relayed by one live relay at a time (its lease), one batch
-- at a time, which keeps each aggregate's events in order across relays.
ALTER TABLE {{table}} ADD COLUMN partition integer
    GENERATED ALWAYS AS (((hashtextextended(aggregateid, 0) & 9223372036854775807) % {{partitions}})::integer) STORED;

CREATE INDEX {{by_part_idx}} ON {{table}} (partition, seq) WHERE published_at IS NULL;

-- One row per partition. A relay owns a partition while expires_at, judged
-- by the database clock, is in the future; epoch grows with every change of
-- owner and fences a relay that lost its lease.
CREATE TABLE {{leases}} (
    partition  integer     PRIMARY KEY,
    owner      text,
    epoch      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO {{leases}} (partition) SELECT generate_series(0, {{partitions}} - 1);

-- Refuses the outcome of a batch unless the relay still holds, by the
-- database clock, every lease the batch was claimed under.
CREATE FUNCTION {{fence_fn}}(p_relay text, p_partitions integer[], p_epochs bigint[]) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF (SELECT count(*) FROM {{leases}} l
        JOIN unnest(p_partitions, p_epochs) AS m(partition, epoch)
          ON l.partition = m.partition AND l.epoch = m.epoch
        WHERE l.owner = p_relay AND l.expires_at > clock_timestamp()) <> cardinality(p_partitions) THEN
        RAISE EXCEPTION 'lease lost: relay % no longer holds the leases this batch was claimed under', p_relay
            USING ERRCODE = 'P0001', HINT = 'outbox-lease-lost';
    END IF;
END
$fn$;

-- Published rows kept with --retention keep are cleaned up in batches.
CREATE INDEX {{published_idx}} ON {{table}} (published_at) WHERE published_at IS NOT NULL;

-- Live relays, for balancing the partitions between them.
CREATE TABLE {{relays}} (
    relay      text        PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- Aggregates whose later events must wait: an earlier event is being
-- retried, or was dead-lettered under the hold policy. Events of the
-- aggregate after seq are not claimed while the row exists.
CREATE TABLE {{held}} (
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    seq           bigint      NOT NULL,
    event_id      uuid        NOT NULL,
    reason        text        NOT NULL,
    held_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregatetype, aggregateid)
);
CREATE INDEX {{held_event_idx}} ON {{held}} (event_id);

ALTER TABLE {{dead_letter}} ADD COLUMN held boolean NOT NULL DEFAULT false;

-- Who did what to dead letters, and when.
CREATE TABLE {{audit}} (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor    text        NOT NULL,
    action   text        NOT NULL,
    event_id uuid,
    detail   text        NOT NULL DEFAULT ''
);
