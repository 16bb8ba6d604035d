-- Safe upgrades (docs/operations.md, Upgrades). A relay records, when it
-- registers and at every renewal, the newest schema version its code knows,
-- its release and when it renewed. Relays of earlier releases insert only
-- relay and expires_at: they register as before, and read as of an unknown
-- (older) version. Each ALTER is atomic, so a run cut short is redone or
-- found done (duplicate column).
ALTER TABLE {{relays}}
    ADD COLUMN schema_version INT          NULL,
    ADD COLUMN `release`      VARCHAR(255) NOT NULL DEFAULT '',
    ADD COLUMN renewed_at     DATETIME(6)  NULL;

-- The oldest relay schema version each applied migration works with (its
-- "-- relays: from N" line; 0: every relay), recorded as it is applied.
ALTER TABLE {{migrations}} ADD COLUMN relays_from INT NOT NULL DEFAULT 0;
