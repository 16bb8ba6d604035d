DROP INDEX IF EXISTS {{waiting_idx}};
ALTER TABLE {{table}} DROP COLUMN deliver_at;
