-- Safe upgrades for log tailing (docs/operations.md, Upgrades). A slot's
-- streamer records, where it holds the slot's lease, what a polling relay
-- records in the relays registry (version 20): the newest schema version
-- its code knows and its release, when it took the lease and when it last
-- renewed it, with the lease's epoch. `outbox migrate` counts a streamer
-- whose lease has not expired among the live relays. A streamer of an
-- earlier release takes the lease without recording: the epoch then
-- differs, and it reads as of an unknown (older) version.
ALTER TABLE {{cdc}}
    ADD COLUMN schema_version integer,
    ADD COLUMN release        text NOT NULL DEFAULT '',
    ADD COLUMN leased_at      timestamptz,
    ADD COLUMN renewed_at     timestamptz,
    ADD COLUMN recorded_epoch bigint;
