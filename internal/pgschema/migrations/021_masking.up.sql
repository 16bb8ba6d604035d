-- The masking stored with the table (docs/security.md): the payload paths
-- every process that shows a payload masks (the command line, the console
-- and its JSON API), so that none needs them repeated as flags. An empty
-- aggregatetype or type applies to every event. `outbox mask` writes it,
-- as the owner; `outbox grants` gives the relay and the console SELECT
-- only.
CREATE TABLE {{masking}} (
    aggregatetype text        NOT NULL DEFAULT '',
    type          text        NOT NULL DEFAULT '',
    path          text        NOT NULL CHECK (path <> '' AND length(path) <= 255),
    source        text        NOT NULL,
    actor         text        NOT NULL,
    at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregatetype, type, path)
);
