-- Without deliver_at a parked delayed event would be released at once:
-- refused while one is still waiting.
DO $do$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM {{cdc_parked}} WHERE deliver_at > now();
    IF n > 0 THEN
        RAISE EXCEPTION 'log tailing holds % parked delayed event(s) not due yet, which would be published at once without version 14: revert once they are published', n;
    END IF;
END
$do$;
ALTER TABLE {{cdc_parked}} DROP COLUMN IF EXISTS deliver_at;
