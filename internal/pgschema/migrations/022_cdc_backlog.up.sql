-- The backlog of log tailing in message and insert+delete mode
-- (docs/cdc.md): those events are never rows of the table, so the table
-- cannot count them. The slot's streamer records here, about every second
-- while it streams, what it decoded and has not yet published or
-- dead-lettered and is not a row of the table, and the commit time of the
-- oldest such transaction; `outbox status`, the console and the metrics
-- read it. NULL until a streamer of this version recorded.
ALTER TABLE {{cdc}}
    ADD COLUMN backlog_mode          text,
    ADD COLUMN backlog_events        bigint,
    ADD COLUMN backlog_oldest_commit timestamptz,
    ADD COLUMN backlog_recorded_at   timestamptz;
