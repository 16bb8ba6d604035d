-- Safe upgrades (docs/operations.md, Upgrades). A relay records, when it
-- registers and at every renewal, the newest schema version its code knows,
-- its release and when it renewed. Relays of earlier releases insert only
-- relay and expires_at: they register as before, and read as of an unknown
-- (older) version.
ALTER TABLE {{relays}} ADD COLUMN schema_version INTEGER;
ALTER TABLE {{relays}} ADD COLUMN "release" TEXT NOT NULL DEFAULT '';
ALTER TABLE {{relays}} ADD COLUMN renewed_at TEXT;

-- The oldest relay schema version each applied migration works with (its
-- "-- relays: from N" line; 0: every relay), recorded as it is applied.
ALTER TABLE {{migrations}} ADD COLUMN relays_from INTEGER NOT NULL DEFAULT 0;
