-- Every statement here is idempotent (CREATE TABLE IF NOT EXISTS, indexes
-- inside the CREATE): MySQL commits DDL at once, so a migration cut short
-- is simply run again. Text is utf8mb4 with binary collation, compared
-- byte for byte as on PostgreSQL; times are UTC (UTC_TIMESTAMP).

-- Dedupe records: one row per event a consumer handled (or skipped as
-- stale). The primary key is what makes a second copy a duplicate.
CREATE TABLE IF NOT EXISTS {{table}} (
    consumer     VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_id     CHAR(36)     CHARACTER SET ascii NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, event_id),
    KEY {{processed_idx}} (consumer, processed_at)
) ENGINE=InnoDB;

-- The version guard: the last version each consumer applied per aggregate.
CREATE TABLE IF NOT EXISTS {{versions}} (
    consumer      VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregatetype VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregateid   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    version       BIGINT       NOT NULL,
    updated_at    DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, aggregatetype, aggregateid)
) ENGINE=InnoDB;

-- Messages a consumer could not handle, as received.
CREATE TABLE IF NOT EXISTS {{dead_letter}} (
    id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer         VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_id         MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT (''),
    aggregatetype    MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT (''),
    aggregateid      MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT (''),
    type             MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT (''),
    destination      MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT (''),
    headers          JSON         NOT NULL DEFAULT ('{}'),
    payload          LONGBLOB     NULL,
    error            MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    dead_lettered_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY {{dead_letter_idx}} (consumer, id)
) ENGINE=InnoDB;
