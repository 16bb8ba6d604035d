-- Least privilege (docs/security.md): the audit is append-only by
-- privilege. Idempotent, like every migration: MySQL commits DDL at once.
--
-- Until now a row in the marker table {{audit_prune}} let any DELETE of
-- the audit through, and any account that could write the tables could
-- put one there. Now only the DELETE of the procedure below passes: it
-- marks its own connection (CONNECTION_ID()), and the guard looks for
-- that mark, so a row some other session left opens nothing. The marker
-- table and the audit are written only by the owner (the account that
-- migrates, the procedure's definer): `outbox grants` gives no other
-- account any right on the marker, nor UPDATE or DELETE on the audit. A
-- trigger cannot tell who called (inside it CURRENT_USER() is its own
-- definer): privilege is the boundary, the guard catches mistakes.
DELETE FROM {{audit_prune}};
ALTER TABLE {{audit_prune}} MODIFY id BIGINT UNSIGNED NOT NULL;

DROP TRIGGER IF EXISTS {{audit_del}};
CREATE TRIGGER {{audit_del}} BEFORE DELETE ON {{audit}} FOR EACH ROW IF NOT EXISTS (SELECT 1 FROM {{audit_prune}} WHERE id = CONNECTION_ID()) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the audit table is append-only: DELETE refused (old rows are removed with outbox audit prune --before TIME, as the owner)'; END IF;

-- Deletes the audit rows older than p_before and records it: who asked
-- (p_actor, p_role, p_reason, and the database account of the session),
-- how many rows went and before when; returns the count as a result set.
-- It runs as its definer (the owner) in a transaction of its own: call it
-- outside a transaction (START TRANSACTION would commit the caller's).
DROP PROCEDURE IF EXISTS {{audit_prune}};
CREATE PROCEDURE {{audit_prune}}(IN p_before DATETIME(6), IN p_actor VARCHAR(255), IN p_role VARCHAR(32), IN p_reason TEXT)
MODIFIES SQL DATA SQL SECURITY DEFINER
BEGIN
    DECLARE n BIGINT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    IF p_before IS NULL THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'audit prune: no time given: rows older than it are deleted';
    END IF;
    START TRANSACTION;
    INSERT INTO {{audit_prune}} (id) VALUES (CONNECTION_ID());
    DELETE FROM {{audit}} WHERE at < p_before;
    SET n = ROW_COUNT();
    DELETE FROM {{audit_prune}} WHERE id = CONNECTION_ID();
    INSERT INTO {{audit}} (actor, role, action, detail, reason)
    VALUES (p_actor, p_role, 'audit-prune',
            CONCAT('deleted ', n, ' rows older than ', DATE_FORMAT(p_before, '%Y-%m-%dT%H:%i:%s.%fZ'), ' (database account ', USER(), ')'), p_reason);
    COMMIT;
    SELECT n;
END;
