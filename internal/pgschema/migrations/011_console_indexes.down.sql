DROP INDEX IF EXISTS {{audit_actor_idx_q}};
DROP INDEX IF EXISTS {{audit_action_idx_q}};
DROP INDEX IF EXISTS {{audit_request_idx_q}};
DROP INDEX IF EXISTS {{audit_event_idx_q}};
DROP INDEX IF EXISTS {{dl_aggid_idx_q}};
DROP INDEX IF EXISTS {{dl_type_idx_q}};
DROP INDEX IF EXISTS {{dl_aggtype_idx_q}};
ALTER TABLE {{dead_letter}} DROP COLUMN IF EXISTS failure_group;
