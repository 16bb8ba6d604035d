-- The notify trigger looks up {{wakeup}} again.
--
-- Writers in flight hold the outbox table and then read the sequence (in
-- the trigger), and the migrations below this one lock the table: take the
-- table first (as they will), so that dropping the sequence never waits on
-- a writer that waits on this transaction.
LOCK TABLE {{table}} IN ACCESS EXCLUSIVE MODE;
CREATE OR REPLACE FUNCTION {{notify_fn}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF lower(coalesce(current_setting('outbox.notify', true), '')) NOT IN ('off', 'false', 'no', '0')
       AND EXISTS (SELECT 1 FROM {{wakeup}} WHERE expires_at > now()) THEN
        PERFORM pg_notify({{channel}}, '');
    END IF;
    RETURN NULL;
END
$fn$;
DROP TRIGGER {{awake_trg}} ON {{wakeup}};
DROP FUNCTION {{awake_fn}}();
DROP SEQUENCE {{awake}};
