DROP INDEX IF EXISTS {{waiting_idx_q}};
ALTER TABLE {{table}} DROP COLUMN IF EXISTS deliver_at;
