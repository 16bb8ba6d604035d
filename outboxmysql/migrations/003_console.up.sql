-- relays: from 3
-- (Relays before version 3 read no pauses: they would publish what an
-- operator paused.)
-- The operations console (package ops): pauses, the overview's samples,
-- requests that need a second person, the role and reason of every audit
-- row, and the guard that keeps the audit append-only. Every step but the
-- ALTER of the audit table is idempotent; that one ALTER is atomic.

-- Pauses in force: the relays read them at most once per poll interval.
CREATE TABLE IF NOT EXISTS {{pause}} (
    scope   VARCHAR(16)  CHARACTER SET ascii NOT NULL,
    `value` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    actor   VARCHAR(255) NOT NULL,
    role    VARCHAR(32)  NOT NULL DEFAULT '',
    reason  TEXT         NOT NULL,
    since   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (scope, `value`),
    CHECK (scope IN ('all', 'destination', 'aggregatetype')),
    CHECK ((scope = 'all') = (`value` = ''))
) ENGINE=InnoDB;

-- What the console samples for the overview's chart.
CREATE TABLE IF NOT EXISTS {{samples}} (
    at           DATETIME(6) NOT NULL PRIMARY KEY,
    backlog      BIGINT      NOT NULL,
    oldest_age   DOUBLE      NOT NULL,
    dead_letters BIGINT      NOT NULL,
    last_seq     BIGINT      NOT NULL
) ENGINE=InnoDB;

-- Replays and repairs: requested by one user, approved by another, then
-- carried out by a console's executor, which renews heartbeat_at with
-- every batch; epoch grows with every take-over and fences a stale
-- executor.
CREATE TABLE IF NOT EXISTS {{requests}} (
    id             CHAR(36)     CHARACTER SET ascii NOT NULL PRIMARY KEY,
    kind           VARCHAR(16)  NOT NULL,
    state          VARCHAR(16)  NOT NULL DEFAULT 'pending',
    requester      VARCHAR(255) NOT NULL,
    requester_role VARCHAR(32)  NOT NULL,
    reason         TEXT         NOT NULL,
    -- Text, not JSON: a repair's proposed payload is kept as written.
    params         LONGTEXT     NOT NULL,
    created_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    expires_at     DATETIME(6)  NOT NULL,
    decided_by     VARCHAR(255) NOT NULL DEFAULT '',
    decided_role   VARCHAR(32)  NOT NULL DEFAULT '',
    decided_at     DATETIME(6)  NULL,
    decision_note  TEXT         NOT NULL DEFAULT (''),
    executor       VARCHAR(255) NOT NULL DEFAULT '',
    epoch          BIGINT       NOT NULL DEFAULT 0,
    heartbeat_at   DATETIME(6)  NULL,
    started_at     DATETIME(6)  NULL,
    finished_at    DATETIME(6)  NULL,
    total          BIGINT       NULL,
    done           BIGINT       NOT NULL DEFAULT 0,
    `cursor`       BIGINT       NOT NULL DEFAULT 0,
    `error`        TEXT         NOT NULL DEFAULT (''),
    KEY by_created (created_at),
    CHECK (kind IN ('replay', 'repair')),
    CHECK (state IN ('pending', 'approved', 'executing', 'done', 'failed', 'cancelled', 'rejected', 'expired'))
) ENGINE=InnoDB;

-- Holds a row only inside the transaction of `outbox audit prune`: the
-- one time the guard below lets rows of the audit be deleted.
CREATE TABLE IF NOT EXISTS {{audit_prune}} (
    id INT NOT NULL PRIMARY KEY
) ENGINE=InnoDB;

ALTER TABLE {{audit}}
    ADD COLUMN role       VARCHAR(32) NOT NULL DEFAULT '',
    ADD COLUMN reason     TEXT        NOT NULL DEFAULT (''),
    ADD COLUMN request_id CHAR(36)    CHARACTER SET ascii NULL,
    ADD COLUMN `before`   LONGTEXT    NULL,
    ADD COLUMN `after`    LONGTEXT    NULL,
    ADD KEY by_at (at),
    ADD KEY by_request (request_id);

-- The audit is append-only: no UPDATE, and no DELETE but the prune's.
DROP TRIGGER IF EXISTS {{audit_upd}};
CREATE TRIGGER {{audit_upd}} BEFORE UPDATE ON {{audit}} FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the audit table is append-only: UPDATE refused (old rows are removed with outbox audit prune --before TIME)';
DROP TRIGGER IF EXISTS {{audit_del}};
CREATE TRIGGER {{audit_del}} BEFORE DELETE ON {{audit}} FOR EACH ROW IF NOT EXISTS (SELECT 1 FROM {{audit_prune}}) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the audit table is append-only: DELETE refused (old rows are removed with outbox audit prune --before TIME)'; END IF;
