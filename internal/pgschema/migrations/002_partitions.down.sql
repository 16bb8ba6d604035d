DROP TABLE IF EXISTS {{audit}};
ALTER TABLE {{dead_letter}} DROP COLUMN IF EXISTS held;
DROP TABLE IF EXISTS {{held}};
DROP TABLE IF EXISTS {{relays}};
DROP FUNCTION IF EXISTS {{fence_fn}}(text, integer[], bigint[]);
DROP TABLE IF EXISTS {{leases}};
DROP INDEX IF EXISTS {{published_idx_q}};
ALTER TABLE {{table}} DROP COLUMN IF EXISTS partition;
