-- Writers whose transactions end in PREPARE TRANSACTION (two-phase commit)
-- cannot have sent a NOTIFY, so they may turn the wake-up off for their
-- transaction, session, role or database with the setting outbox.notify:
--     SET LOCAL outbox.notify = off;             -- this transaction
--     ALTER ROLE app_xa SET outbox.notify = off; -- every session of a role
-- Their events wake no relay; an idle relay finds them at its next poll
-- (--poll-interval). off, false, no and 0 (any case) turn it off; any other
-- value, or none, notifies as before.
CREATE OR REPLACE FUNCTION {{notify_fn}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF lower(coalesce(current_setting('outbox.notify', true), '')) NOT IN ('off', 'false', 'no', '0')
       AND EXISTS (SELECT 1 FROM {{wakeup}} WHERE expires_at > now()) THEN
        PERFORM pg_notify({{channel}}, '');
    END IF;
    RETURN NULL;
END
$fn$;
