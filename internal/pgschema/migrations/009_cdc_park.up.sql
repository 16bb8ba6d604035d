-- Log tailing (docs/cdc.md): exact drains and durable parking.
--
-- The rows a new replication slot's stream does not hold: the unpublished
-- rows visible in the snapshot the slot was made at (and no other), listed
-- by id under the slot's consistent point, so that the streamer drains
-- exactly those from the table and the stream brings the rest, each once.
-- drain_lsn is the consistent point whose list is complete; NULL (a slot
-- made before this version, or a relay that died while listing) drains
-- every unpublished row.
ALTER TABLE {{cdc}} ADD COLUMN drain_lsn pg_lsn;

CREATE TABLE {{cdc_drain}} (
    slot text   NOT NULL,
    lsn  pg_lsn NOT NULL,
    id   uuid   NOT NULL,
    PRIMARY KEY (slot, lsn, id)
);

-- Events of aggregates held behind a dead letter (poison policy hold),
-- parked by the streamer so that the slot may confirm past them: the WAL
-- is the only copy of messages and insert+delete rows. Released in pos
-- order (the order they were committed in) once the aggregate is no longer
-- held (the dead letter retried and published, discarded, or released).
CREATE TABLE {{cdc_parked}} (
    pos                bigint      GENERATED ALWAYS AS IDENTITY,
    id                 uuid        NOT NULL UNIQUE,
    aggregatetype      text        NOT NULL,
    aggregateid        text        NOT NULL,
    type               text        NOT NULL,
    -- The payload as written (JSON text, byte for byte), or payload_raw.
    payload            text,
    payload_raw        bytea,
    headers            text,
    tracingspancontext text        NOT NULL DEFAULT '',
    seq                bigint      NOT NULL,
    created_at         timestamptz NOT NULL,
    -- Why the event cannot be published as written ('' when it can).
    bad                text        NOT NULL DEFAULT '',
    -- A row of the outbox table (deleted, or marked, once published), and
    -- the transaction that inserted it; else a message.
    is_row             boolean     NOT NULL,
    xid                bigint      NOT NULL DEFAULT 0,
    lsn                pg_lsn      NOT NULL,
    parked_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregatetype, aggregateid, pos)
);
