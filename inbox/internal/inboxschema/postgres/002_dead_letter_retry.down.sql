ALTER TABLE {{dead_letter}} DROP COLUMN retry_requested_at;
