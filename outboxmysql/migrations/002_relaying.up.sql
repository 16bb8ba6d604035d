-- Idempotent, like every migration: MySQL commits DDL at once.

-- Events the broker refused for good, or that ran out of attempts.
CREATE TABLE IF NOT EXISTS {{dead_letter}} (
    id                 CHAR(36)     CHARACTER SET ascii NOT NULL PRIMARY KEY,
    aggregatetype      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregateid        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    type               VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload            JSON         NULL,
    seq                BIGINT       NOT NULL,
    created_at         DATETIME(6)  NOT NULL,
    headers            JSON         NOT NULL DEFAULT ('{}'),
    tracingspancontext TEXT         NULL,
    payload_raw        LONGBLOB     NULL,
    attempts           INT          NOT NULL,
    last_error         TEXT         NOT NULL,
    dead_lettered_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- The aggregate's later events wait for this one (the hold policy).
    held               BOOLEAN      NOT NULL DEFAULT FALSE,
    KEY by_time (dead_lettered_at, seq)
) ENGINE=InnoDB;

-- Live relays, for balancing the partitions between them.
CREATE TABLE IF NOT EXISTS {{relays}} (
    relay      VARCHAR(255) NOT NULL PRIMARY KEY,
    started_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    expires_at DATETIME(6)  NOT NULL
) ENGINE=InnoDB;

-- Aggregates whose later events must wait: an earlier event is being
-- retried, or was dead-lettered under the hold policy. Events of the
-- aggregate after seq are not claimed while the row exists.
CREATE TABLE IF NOT EXISTS {{held}} (
    aggregatetype VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregateid   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    seq           BIGINT       NOT NULL,
    event_id      CHAR(36)     CHARACTER SET ascii NOT NULL,
    reason        VARCHAR(32)  NOT NULL,
    held_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (aggregatetype, aggregateid),
    KEY by_event (event_id)
) ENGINE=InnoDB;

-- Who did what to dead letters, and when.
CREATE TABLE IF NOT EXISTS {{audit}} (
    id       BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    actor    VARCHAR(255) NOT NULL,
    action   VARCHAR(32)  NOT NULL,
    event_id CHAR(36)     CHARACTER SET ascii NULL,
    detail   TEXT         NOT NULL
) ENGINE=InnoDB;
