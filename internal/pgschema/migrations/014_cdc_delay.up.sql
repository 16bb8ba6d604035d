-- Delayed events under log tailing (docs/delayed.md): the streamer parks a
-- row whose deliver_at is ahead, with the events of its aggregate after it,
-- and releases them in order once it is due.
ALTER TABLE {{cdc_parked}} ADD COLUMN deliver_at timestamptz;
