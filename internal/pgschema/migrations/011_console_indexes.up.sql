-- The console on a large table (docs/console.md#speed). Dead letters and
-- audit rows are written once per failure or per human action, so indexes
-- on them cost the writers and the relay nothing that shows; each answers
-- a filter of the console that otherwise reads every row. The outbox table
-- itself gets none: every index there is paid by every write.

-- A dead letter's failure group (event type and error class: the last
-- error with UUIDs and numbers of four or more digits blanked, cut to 200
-- characters), computed once when it is written instead of for every row
-- on every view of the groups. The index answers the groups page (an
-- index-only scan) and a group's retry or discard.
ALTER TABLE {{dead_letter}} ADD COLUMN failure_group text GENERATED ALWAYS AS (
    md5(length(type)::text || ':' || type ||
        left(regexp_replace(regexp_replace(last_error, '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'), '[0-9]{4,}', '<n>', 'g'), 200))
) STORED;
CREATE INDEX {{dl_group_idx}} ON {{dead_letter}} (failure_group, dead_lettered_at, seq);

-- The list of dead letters by aggregate type and by event type, in its
-- order (and the distinct values a destination filter resolves), and by
-- aggregate id.
CREATE INDEX {{dl_aggtype_idx}} ON {{dead_letter}} (aggregatetype, dead_lettered_at, seq);
CREATE INDEX {{dl_type_idx}} ON {{dead_letter}} (type, dead_lettered_at, seq);
CREATE INDEX {{dl_aggid_idx}} ON {{dead_letter}} (aggregateid);

-- The audit by event, request, action and actor, newest first.
CREATE INDEX {{audit_event_idx}} ON {{audit}} (event_id, id) WHERE event_id IS NOT NULL;
CREATE INDEX {{audit_request_idx}} ON {{audit}} (request_id, id) WHERE request_id IS NOT NULL;
CREATE INDEX {{audit_action_idx}} ON {{audit}} (action, id);
CREATE INDEX {{audit_actor_idx}} ON {{audit}} (actor, id);
