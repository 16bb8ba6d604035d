-- Dedupe records: one row per event a consumer handled (or skipped as
-- stale). The primary key is what makes a second copy a duplicate. Times
-- are UTC text (2006-01-02T15:04:05.000Z), which sorts like time.
CREATE TABLE {{table}} (
    consumer     TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (consumer, event_id)
) WITHOUT ROWID;
CREATE INDEX {{schema}}.{{processed_idx}} ON {{table_name}} (consumer, processed_at);

-- The version guard: the last version each consumer applied per aggregate.
CREATE TABLE {{versions}} (
    consumer      TEXT    NOT NULL,
    aggregatetype TEXT    NOT NULL,
    aggregateid   TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    updated_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (consumer, aggregatetype, aggregateid)
) WITHOUT ROWID;

-- Messages a consumer could not handle, as received.
CREATE TABLE {{dead_letter}} (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer         TEXT NOT NULL,
    event_id         TEXT NOT NULL DEFAULT '',
    aggregatetype    TEXT NOT NULL DEFAULT '',
    aggregateid      TEXT NOT NULL DEFAULT '',
    type             TEXT NOT NULL DEFAULT '',
    destination      TEXT NOT NULL DEFAULT '',
    headers          TEXT NOT NULL DEFAULT '{}',
    payload          BLOB,
    error            TEXT NOT NULL,
    dead_lettered_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX {{schema}}.{{dead_letter_idx}} ON {{dead_letter_name}} (consumer, id);
