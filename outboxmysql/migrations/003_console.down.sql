DROP TRIGGER IF EXISTS {{audit_del}};
DROP TRIGGER IF EXISTS {{audit_upd}};
DROP TABLE IF EXISTS {{audit_prune}};
DROP TABLE IF EXISTS {{requests}};
DROP TABLE IF EXISTS {{samples}};
DROP TABLE IF EXISTS {{pause}};
ALTER TABLE {{audit}} DROP KEY by_request, DROP KEY by_at, DROP COLUMN `after`, DROP COLUMN `before`, DROP COLUMN request_id, DROP COLUMN reason, DROP COLUMN role;
