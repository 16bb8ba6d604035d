ALTER TABLE {{migrations}} DROP COLUMN relays_from;
ALTER TABLE {{relays}} DROP COLUMN renewed_at;
ALTER TABLE {{relays}} DROP COLUMN "release";
ALTER TABLE {{relays}} DROP COLUMN schema_version;
