-- Back to version 4: a row in the marker table lets a DELETE of the audit
-- through again (the guard of version 3).
DROP PROCEDURE IF EXISTS {{audit_prune}};
DELETE FROM {{audit_prune}};
ALTER TABLE {{audit_prune}} MODIFY id INT NOT NULL;
DROP TRIGGER IF EXISTS {{audit_del}};
CREATE TRIGGER {{audit_del}} BEFORE DELETE ON {{audit}} FOR EACH ROW IF NOT EXISTS (SELECT 1 FROM {{audit_prune}}) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the audit table is append-only: DELETE refused (old rows are removed with outbox audit prune --before TIME)'; END IF;
