-- An operator's request to hand a dead letter to the consumer's handler
-- again (`outbox inbox dlq retry`): a running consumer claims it, clears
-- it, and deletes the dead letter once the message is handled or
-- dead-lettered anew. One statement: it commits with the DDL.
ALTER TABLE {{dead_letter}} ADD COLUMN retry_requested_at DATETIME(6) NULL;
