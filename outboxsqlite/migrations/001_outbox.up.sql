-- The outbox table. The first five columns are Debezium's outbox contract;
-- every other column has a default or is computed, so a plain INSERT of
-- those five, from any program that speaks SQLite, is relayed like any
-- other event. Times are UTC text, 'YYYY-MM-DD HH:MM:SS.SSS', by the
-- database clock.
CREATE TABLE {{table}} (
    id                 TEXT    NOT NULL UNIQUE,
    aggregatetype      TEXT    NOT NULL,
    aggregateid        TEXT    NOT NULL,
    type               TEXT    NOT NULL,
    payload            TEXT    CHECK (payload IS NULL OR json_valid(payload)),
    -- Insertion order; the relay claims in this order. AUTOINCREMENT never
    -- hands out a position twice, so a retried dead letter can take its
    -- original one back.
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at         TEXT    NOT NULL DEFAULT ({{now}}),
    headers            TEXT    NOT NULL DEFAULT '{}',
    tracingspancontext TEXT,
    -- A payload that is not JSON (payload is then NULL).
    payload_raw        BLOB,
    attempts           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at    TEXT,
    last_error         TEXT,
    published_at       TEXT,
    -- The partition the aggregate hashes into, set by the trigger below.
    partition          INTEGER
);

-- The weights of the partition hash, one per character position.
CREATE TABLE {{hash}} (
    pos    INTEGER PRIMARY KEY,
    weight INTEGER NOT NULL
);
INSERT INTO {{hash}} (pos, weight)
    WITH RECURSIVE p(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM p WHERE n < {{hash_chars}})
    SELECT n, {{weight_expr}} FROM p;

-- Every aggregate hashes, in the database, into one of a fixed number of
-- partitions, so rows inserted by plain SQL get theirs too: the weighted
-- sum of the code points of the aggregate id (its first {{hash_chars}}
-- characters) and of its length, modulo a prime, mixed by one more
-- multiplication, modulo the partition count. SQLite has no built-in hash, and a generated column calling a
-- function registered in Go would make the table unusable for every other
-- program (the sqlite3 shell could not even insert); this trigger uses
-- built-in functions only. It runs inside the INSERT, so no reader ever
-- sees a row without its partition.
CREATE TRIGGER {{partition_trg}} AFTER INSERT ON {{table_name}} FOR EACH ROW
BEGIN
    UPDATE {{table_name}} SET partition = (
        SELECT ((((length(NEW.aggregateid) * {{length_weight}}
                   + coalesce(sum(h.weight * unicode(substr(NEW.aggregateid, h.pos, 1))), 0)) % {{hash_mod}})
                 * {{mix}} % {{hash_mod}}) >> 8) % {{partitions}}
        FROM {{hash_name}} AS h WHERE h.pos <= length(NEW.aggregateid))
    WHERE seq = NEW.seq;
END;

-- The claim reads these: unpublished rows in insertion order, overall and
-- per partition.
CREATE INDEX {{pending_idx}} ON {{table_name}} (seq) WHERE published_at IS NULL;
CREATE INDEX {{by_part_idx}} ON {{table_name}} (partition, seq) WHERE published_at IS NULL;
-- Published rows kept with retention keep are cleaned up in batches.
CREATE INDEX {{published_idx}} ON {{table_name}} (published_at) WHERE published_at IS NOT NULL;

-- Events the broker refused for good, or that ran out of attempts.
CREATE TABLE {{dead_letter}} (
    id                 TEXT    PRIMARY KEY,
    aggregatetype      TEXT    NOT NULL,
    aggregateid        TEXT    NOT NULL,
    type               TEXT    NOT NULL,
    payload            TEXT,
    seq                INTEGER NOT NULL,
    created_at         TEXT    NOT NULL,
    headers            TEXT    NOT NULL DEFAULT '{}',
    tracingspancontext TEXT,
    payload_raw        BLOB,
    attempts           INTEGER NOT NULL,
    last_error         TEXT    NOT NULL,
    dead_lettered_at   TEXT    NOT NULL DEFAULT ({{now}}),
    -- 1 when the aggregate's later events wait for this one.
    held               INTEGER NOT NULL DEFAULT 0
);

-- One row per partition. A relay owns a partition while expires_at, by
-- the database clock, is in the future; epoch grows with every change of
-- owner and fences a relay that lost its lease. claimed_by names the batch
-- being published from the partition (until claim_expires_at): no other
-- claim takes the partition meanwhile.
CREATE TABLE {{leases}} (
    partition        INTEGER PRIMARY KEY,
    owner            TEXT,
    epoch            INTEGER NOT NULL DEFAULT 0,
    expires_at       TEXT,
    claimed_by       TEXT,
    claim_expires_at TEXT
);
INSERT INTO {{leases}} (partition)
    WITH RECURSIVE p(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM p WHERE n + 1 < {{partitions}})
    SELECT n FROM p;

-- Live relays, for balancing the partitions between them.
CREATE TABLE {{relays}} (
    relay      TEXT PRIMARY KEY,
    started_at TEXT NOT NULL DEFAULT ({{now}}),
    expires_at TEXT NOT NULL
);

-- Aggregates whose later events must wait: an earlier event is being
-- retried, or was dead-lettered under the hold policy. Events of the
-- aggregate after seq are not claimed while the row exists.
CREATE TABLE {{held}} (
    aggregatetype TEXT    NOT NULL,
    aggregateid   TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    event_id      TEXT    NOT NULL,
    reason        TEXT    NOT NULL,
    held_at       TEXT    NOT NULL DEFAULT ({{now}}),
    PRIMARY KEY (aggregatetype, aggregateid)
);
CREATE INDEX {{held_event_idx}} ON {{held_name}} (event_id);

-- Who did what to dead letters, and when.
CREATE TABLE {{audit}} (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       TEXT    NOT NULL DEFAULT ({{now}}),
    actor    TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    event_id TEXT,
    detail   TEXT    NOT NULL DEFAULT ''
);
