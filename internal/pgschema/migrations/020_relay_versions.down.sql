ALTER TABLE {{migrations}} DROP COLUMN relays_from;
ALTER TABLE {{relays}}
    DROP COLUMN schema_version,
    DROP COLUMN release,
    DROP COLUMN renewed_at;
