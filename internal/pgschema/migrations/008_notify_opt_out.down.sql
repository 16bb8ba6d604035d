-- Every insert notifies an idle relay again, whatever outbox.notify says.
CREATE OR REPLACE FUNCTION {{notify_fn}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM {{wakeup}} WHERE expires_at > now()) THEN
        PERFORM pg_notify({{channel}}, '');
    END IF;
    RETURN NULL;
END
$fn$;
