-- The masking stored with the table (docs/security.md): the payload paths
-- every process that shows a payload masks (the command line, the console
-- and its JSON API), so that none needs them repeated as flags. An empty
-- aggregatetype or type applies to every event. `outbox mask` writes it.
CREATE TABLE {{masking}} (
    aggregatetype TEXT NOT NULL DEFAULT '',
    type          TEXT NOT NULL DEFAULT '',
    path          TEXT NOT NULL CHECK (path <> '' AND length(path) <= 255),
    source        TEXT NOT NULL,
    actor         TEXT NOT NULL,
    at            TEXT NOT NULL DEFAULT ({{now}}),
    PRIMARY KEY (aggregatetype, type, path)
);
