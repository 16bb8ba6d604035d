-- The operations console. Every audit row says under which role the
-- action was allowed and the reason the actor gave; rows that are not
-- about one event (a login, a refused request) have no event_id.
ALTER TABLE {{audit}}
    ADD COLUMN role   text NOT NULL DEFAULT '',
    ADD COLUMN reason text NOT NULL DEFAULT '';

-- Dead letters are listed and paged in the order they were dead-lettered.
CREATE INDEX {{dead_letter_at_idx}} ON {{dead_letter}} (dead_lettered_at, seq);
