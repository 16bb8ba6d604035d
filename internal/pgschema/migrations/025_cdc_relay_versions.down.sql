ALTER TABLE {{cdc}}
    DROP COLUMN IF EXISTS recorded_epoch,
    DROP COLUMN IF EXISTS renewed_at,
    DROP COLUMN IF EXISTS leased_at,
    DROP COLUMN IF EXISTS release,
    DROP COLUMN IF EXISTS schema_version;
