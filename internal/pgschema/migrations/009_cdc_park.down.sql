DROP TABLE IF EXISTS {{cdc_parked}};
DROP TABLE IF EXISTS {{cdc_drain}};
ALTER TABLE {{cdc}} DROP COLUMN IF EXISTS drain_lsn;
