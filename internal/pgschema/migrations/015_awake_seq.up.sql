-- Wake-ups that cost writers nothing to check (docs/relay.md, wake-ups).
-- Until now the notify trigger looked for a live row in {{wakeup}} with a
-- query on every INSERT statement: an executor run, 3 of the 22 µs the
-- server spent on a single-row insert (docs/benchmarks.md, the notify
-- trigger). The latest expiry of the registrations in {{wakeup}}, in epoch
-- milliseconds, is now kept in the sequence {{awake}}, and the trigger
-- reads it with pg_sequence_last_value: a buffer read, no query.
CREATE SEQUENCE {{awake}} MINVALUE 0 START WITH 0;
-- Every role that inserts events reads it through the trigger; what it
-- tells (until when some relay waits for a wake-up) is no secret. Writers
-- need no grant on {{wakeup}} any more.
GRANT SELECT ON SEQUENCE {{awake}} TO PUBLIC;

-- {{wakeup}} keeps the registrations (one row per relay); a trigger on it
-- keeps {{awake}} equal to the latest live expiry, so relays of every
-- version, which write only {{wakeup}}, keep it right. A change waits for
-- the one before it to commit and then reads the table afresh, so two
-- relays changing their rows at once cannot leave a registration out. It
-- runs as the owner: relays need no right on the sequence.
CREATE FUNCTION {{awake_fn}}() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended({{awake_lock}}, 0));
    PERFORM setval({{awake_literal}}::regclass, coalesce(
        (SELECT max(ceil(extract(epoch FROM expires_at) * 1000))::bigint
         FROM {{wakeup}} WHERE expires_at > now()), 0));
    RETURN NULL;
END
$fn$;

CREATE TRIGGER {{awake_trg}} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {{wakeup}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{awake_fn}}();

-- Set it from the registrations there are now: a statement on the table
-- fires the trigger (a statement trigger fires for no rows too), which is
-- the one place the value is computed. The expired rows it deletes count
-- for nothing.
DELETE FROM {{wakeup}} WHERE expires_at <= now();

-- The check itself: some registration still live (as of the writer's
-- transaction start, as before), and outbox.notify not turned off.
CREATE OR REPLACE FUNCTION {{notify_fn}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF pg_sequence_last_value({{awake_literal}}::regclass) > (extract(epoch FROM now()) * 1000)::bigint
       AND lower(coalesce(current_setting('outbox.notify', true), '')) NOT IN ('off', 'false', 'no', '0') THEN
        PERFORM pg_notify({{channel}}, '');
    END IF;
    RETURN NULL;
END
$fn$;
