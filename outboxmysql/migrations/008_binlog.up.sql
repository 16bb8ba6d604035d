-- Log tailing of the binary log (outboxmysql/cdc, docs/binlog.md). One row
-- per streamer name: the relay that streams the table's binary log owns it
-- while expires_at, judged by the database clock, is in the future; epoch
-- grows with every change of owner and fences a streamer that lost it.
-- file and pos are the place in the binary log up to which every event
-- was published or dead-lettered (NULL: none yet; the relay then relays
-- the rows in the table and streams from a consistent position); gtid is
-- the server's GTID position there, for an operator. hwm_file and hwm_pos
-- are the end of the latest transaction an event of which was published
-- or dead-lettered: after a crash, events up to there whose rows are
-- marked already are not published again (table mode). Idempotent, like
-- every migration: MySQL commits DDL at once.
CREATE TABLE IF NOT EXISTS {{binlog}} (
    name       VARCHAR(64)  CHARACTER SET ascii NOT NULL PRIMARY KEY,
    owner      VARCHAR(255) NULL,
    epoch      BIGINT       NOT NULL DEFAULT 0,
    expires_at DATETIME(6)  NOT NULL DEFAULT '1970-01-01 00:00:00',
    file       VARCHAR(255) NULL,
    pos        BIGINT       NULL,
    gtid       TEXT         NULL,
    hwm_file   VARCHAR(255) NULL,
    hwm_pos    BIGINT       NULL,
    updated_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE=InnoDB;
