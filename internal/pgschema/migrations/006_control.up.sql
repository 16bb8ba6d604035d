-- relays: from 6
-- (Relays before version 6 read no pauses: they would publish what an
-- operator paused.)
-- Pauses and the console's samples (docs/console.md).
--
-- A pause stops the relays from publishing one scope of events until it is
-- lifted: every event ('all', value ''), the events routed to one
-- destination, or the events of one aggregate type. Paused events are
-- never touched: no attempt is spent and their aggregates keep their
-- order; they wait. Relays read this table once per poll interval.
CREATE TABLE {{pause}} (
    scope  text        NOT NULL CHECK (scope IN ('all', 'destination', 'aggregatetype')),
    value  text        NOT NULL DEFAULT '',
    actor  text        NOT NULL,
    role   text        NOT NULL DEFAULT '',
    reason text        NOT NULL DEFAULT '',
    since  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, value),
    CHECK ((scope = 'all') = (value = ''))
);

-- What the console saw, for its chart of the last hour: the backlog, the
-- age of the oldest unpublished event, the dead letters, and the highest
-- seq handed out (inserts since the previous sample, from which the
-- publish rate follows). The console deletes samples older than a day.
CREATE TABLE {{samples}} (
    at           timestamptz      PRIMARY KEY DEFAULT clock_timestamp(),
    backlog      bigint           NOT NULL,
    oldest_age   double precision NOT NULL,
    dead_letters bigint           NOT NULL,
    last_seq     bigint           NOT NULL
);
