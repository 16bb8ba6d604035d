ALTER TABLE {{dead_letter}} ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
ALTER TABLE {{table}} ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
