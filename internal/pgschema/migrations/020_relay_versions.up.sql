-- Safe upgrades (docs/operations.md, Upgrades). A relay records, when it
-- registers and at every renewal, the newest schema version its code knows,
-- its release and when it renewed. Relays of earlier releases insert only
-- relay and expires_at: they register as before, and read as of an unknown
-- (older) version, renewal unknown.
ALTER TABLE {{relays}}
    ADD COLUMN schema_version integer,
    ADD COLUMN release        text NOT NULL DEFAULT '',
    ADD COLUMN renewed_at     timestamptz;

-- The oldest relay schema version each applied migration works with (its
-- "-- relays: from N" line; 0: every relay), recorded as it is applied, so
-- that a relay finds out from the database alone that the table now needs
-- a newer relay than itself, and stops claiming instead of skipping rows.
ALTER TABLE {{migrations}} ADD COLUMN relays_from integer NOT NULL DEFAULT 0;
