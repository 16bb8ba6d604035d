DROP FUNCTION IF EXISTS {{audit_prune_fn}}(timestamptz, text, text, text);
DROP TRIGGER IF EXISTS {{audit_guard_trunc_trg}} ON {{audit}};
DROP TRIGGER IF EXISTS {{audit_guard_trg}} ON {{audit}};
DROP FUNCTION IF EXISTS {{audit_guard_fn}}();
DROP INDEX IF EXISTS {{audit_at_idx_q}};
ALTER TABLE {{audit}} DROP COLUMN IF EXISTS request_id, DROP COLUMN IF EXISTS after, DROP COLUMN IF EXISTS before;
DROP TABLE IF EXISTS {{requests}};
