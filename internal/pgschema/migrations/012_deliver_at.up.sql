-- relays: from 12
-- (Relays before version 12 ignore deliver_at: they would publish delayed
-- events at once.)
-- Delayed events (docs/delayed.md): deliver_at is the earliest time the
-- relay may publish the row (NULL: at once). A writer sets it through
-- Event.DeliverAt or with plain SQL.
ALTER TABLE {{table}} ADD COLUMN deliver_at timestamptz;

-- The rows that may not be due: delayed, or waiting for a retry (set by
-- the relay, or by hand). The claim skips an aggregate's events while an
-- earlier one of it is here and not due, so per-aggregate order holds
-- whatever a writer puts into either column. An undelayed row never
-- enters it: the INSERT of the write path pays only the predicate.
CREATE INDEX {{waiting_idx}} ON {{table}} (aggregatetype, aggregateid, seq)
    WHERE published_at IS NULL AND (deliver_at IS NOT NULL OR next_attempt_at IS NOT NULL);
