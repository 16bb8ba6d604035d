-- relays: from 2
-- (Relays before version 2 read no pauses: they would publish what an
-- operator paused.)
-- The operations console (package ops): pauses, the overview's samples,
-- requests that need a second person, the role and reason of every audit
-- row, and the guard that keeps the audit append-only.

-- Pauses in force: the relay reads them at most once per poll interval.
CREATE TABLE {{pause}} (
    scope  TEXT NOT NULL CHECK (scope IN ('all', 'destination', 'aggregatetype')),
    value  TEXT NOT NULL DEFAULT '',
    actor  TEXT NOT NULL,
    role   TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    since  TEXT NOT NULL DEFAULT ({{now}}),
    PRIMARY KEY (scope, value),
    CHECK ((scope = 'all') = (value = ''))
);

-- What the console samples for the overview's chart.
CREATE TABLE {{samples}} (
    at           TEXT    PRIMARY KEY,
    backlog      INTEGER NOT NULL,
    oldest_age   REAL    NOT NULL,
    dead_letters INTEGER NOT NULL,
    last_seq     INTEGER NOT NULL
);

-- Replays and repairs: requested by one user, approved by another, then
-- carried out by a console's executor, which renews heartbeat_at with
-- every batch; epoch grows with every take-over and fences a stale
-- executor.
CREATE TABLE {{requests}} (
    id             TEXT    PRIMARY KEY,
    kind           TEXT    NOT NULL CHECK (kind IN ('replay', 'repair')),
    state          TEXT    NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'approved', 'executing', 'done', 'failed', 'cancelled', 'rejected', 'expired')),
    requester      TEXT    NOT NULL,
    requester_role TEXT    NOT NULL,
    reason         TEXT    NOT NULL,
    params         TEXT    NOT NULL,
    created_at     TEXT    NOT NULL DEFAULT ({{now}}),
    expires_at     TEXT    NOT NULL,
    decided_by     TEXT    NOT NULL DEFAULT '',
    decided_role   TEXT    NOT NULL DEFAULT '',
    decided_at     TEXT,
    decision_note  TEXT    NOT NULL DEFAULT '',
    executor       TEXT    NOT NULL DEFAULT '',
    epoch          INTEGER NOT NULL DEFAULT 0,
    heartbeat_at   TEXT,
    started_at     TEXT,
    finished_at    TEXT,
    total          INTEGER,
    done           INTEGER NOT NULL DEFAULT 0,
    cursor         INTEGER NOT NULL DEFAULT 0,
    error          TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX {{requests_idx}} ON {{requests_name}} (created_at);

-- Holds a row only inside the transaction of `outbox audit prune`: the
-- one time the guard below lets rows of the audit be deleted.
CREATE TABLE {{audit_prune}} (id INTEGER PRIMARY KEY);

ALTER TABLE {{audit}} ADD COLUMN role TEXT NOT NULL DEFAULT '';
ALTER TABLE {{audit}} ADD COLUMN reason TEXT NOT NULL DEFAULT '';
ALTER TABLE {{audit}} ADD COLUMN request_id TEXT;
ALTER TABLE {{audit}} ADD COLUMN "before" TEXT;
ALTER TABLE {{audit}} ADD COLUMN "after" TEXT;
CREATE INDEX {{audit_at_idx}} ON {{audit_name}} (at);
CREATE INDEX {{audit_request_idx}} ON {{audit_name}} (request_id);
-- The console pages dead letters by the time they were dead-lettered.
CREATE INDEX {{dead_time_idx}} ON {{dead_letter_name}} (dead_lettered_at, seq);

-- The audit is append-only: no UPDATE, and no DELETE but the prune's.
CREATE TRIGGER {{audit_upd}} BEFORE UPDATE ON {{audit_name}}
BEGIN
    SELECT RAISE(ABORT, 'the audit table is append-only: UPDATE refused (old rows are removed with outbox audit prune --before TIME)');
END;
CREATE TRIGGER {{audit_del}} BEFORE DELETE ON {{audit_name}}
WHEN NOT EXISTS (SELECT 1 FROM {{audit_prune_name}})
BEGIN
    SELECT RAISE(ABORT, 'the audit table is append-only: DELETE refused (old rows are removed with outbox audit prune --before TIME)');
END;
