ALTER TABLE {{table}} DROP COLUMN deliver_at;
