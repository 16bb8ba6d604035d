-- The masking stored with the table (docs/security.md): the payload paths
-- every process that shows a payload masks (the command line, the console
-- and its JSON API), so that none needs them repeated as flags. An empty
-- aggregatetype or type applies to every event. `outbox mask` writes it,
-- as the owner; `outbox grants` gives the relay and the console SELECT
-- only.
CREATE TABLE IF NOT EXISTS {{masking}} (
    aggregatetype VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    type          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    path          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    source        VARCHAR(255) NOT NULL,
    actor         VARCHAR(255) NOT NULL,
    at            DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (aggregatetype, type, path),
    CHECK (path <> '')
) ENGINE=InnoDB;
