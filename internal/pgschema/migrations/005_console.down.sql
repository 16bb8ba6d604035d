DROP INDEX IF EXISTS {{dead_letter_at_idx_q}};
ALTER TABLE {{audit}} DROP COLUMN IF EXISTS reason, DROP COLUMN IF EXISTS role;
