ALTER TABLE {{cdc}}
    DROP COLUMN IF EXISTS backlog_recorded_at,
    DROP COLUMN IF EXISTS backlog_oldest_commit,
    DROP COLUMN IF EXISTS backlog_events,
    DROP COLUMN IF EXISTS backlog_mode;
