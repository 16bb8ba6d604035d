-- Every statement here is idempotent (CREATE ... IF NOT EXISTS, INSERT
-- IGNORE): MySQL commits DDL at once, so a migration cut short is simply
-- run again. The outbox table comes last: once it exists, the partitions
-- before it are complete.

-- One row per partition. A relay owns a partition while expires_at, judged
-- by the database clock (UTC_TIMESTAMP), is in the future; epoch grows with
-- every change of owner and fences a relay that lost its lease.
CREATE TABLE IF NOT EXISTS {{leases}} (
    `partition` INT          NOT NULL PRIMARY KEY,
    owner       VARCHAR(255) NULL,
    epoch       BIGINT       NOT NULL DEFAULT 0,
    expires_at  DATETIME(6)  NOT NULL DEFAULT '1970-01-01 00:00:00'
) ENGINE=InnoDB;

INSERT IGNORE INTO {{leases}} (`partition`) VALUES {{partition_rows}};

-- One row per partition, locked (FOR UPDATE SKIP LOCKED) by the transaction
-- of the batch that relays the partition: at most one batch per partition
-- in the whole cluster. A lock dies with its transaction or connection.
CREATE TABLE IF NOT EXISTS {{claims}} (
    `partition` INT NOT NULL PRIMARY KEY
) ENGINE=InnoDB;

INSERT IGNORE INTO {{claims}} (`partition`) VALUES {{partition_rows}};

-- The outbox table. The first five columns are Debezium's outbox contract;
-- every other column has a default or is generated, so a plain INSERT of
-- those five is relayed like any other event. Times are UTC.
CREATE TABLE IF NOT EXISTS {{table}} (
    id                 CHAR(36)     CHARACTER SET ascii NOT NULL,
    aggregatetype      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregateid        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    type               VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload            JSON         NULL,
    -- Insertion order; the relay claims in this order.
    seq                BIGINT       NOT NULL AUTO_INCREMENT,
    created_at         DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    headers            JSON         NOT NULL DEFAULT ('{}'),
    tracingspancontext TEXT         NULL,
    -- A payload that is not JSON (payload is then NULL).
    payload_raw        LONGBLOB     NULL,
    attempts           INT          NOT NULL DEFAULT 0,
    next_attempt_at    DATETIME(6)  NULL,
    last_error         TEXT         NULL,
    published_at       DATETIME(6)  NULL,
    -- The aggregate's partition, computed by the database.
    `partition`        INT          GENERATED ALWAYS AS (CRC32(aggregateid) % {{partitions}}) STORED,
    PRIMARY KEY (seq),
    UNIQUE KEY by_id (id),
    -- The claim reads unpublished rows (published_at IS NULL) in seq order;
    -- the cleanup of kept rows reads published ones by age.
    KEY pending (published_at, seq)
) ENGINE=InnoDB;
