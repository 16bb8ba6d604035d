-- Back to version 25: no key on id.
DO $do$
DECLARE
    pk text;
BEGIN
    SELECT conname INTO pk FROM pg_constraint
    WHERE conrelid = {{table_literal}}::regclass AND contype = 'p';
    IF pk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {{table_literal}}, pk);
    END IF;
END
$do$;
