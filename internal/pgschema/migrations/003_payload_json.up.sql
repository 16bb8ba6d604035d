-- Payloads are kept byte for byte. jsonb re-encoded the text a writer sent
-- (key order, white space, duplicate keys, number spelling), so a consumer
-- that verified a signature over the payload's bytes failed; json keeps
-- the text as written, after checking that it is JSON. It also costs the
-- writer less: no conversion to jsonb's binary form.
--
-- Rows written before are kept as jsonb wrote them. The ALTER rewrites
-- each table under an exclusive lock: on a large backlog, writers wait
-- for it.
ALTER TABLE {{table}} ALTER COLUMN payload TYPE json USING payload::json;
ALTER TABLE {{dead_letter}} ALTER COLUMN payload TYPE json USING payload::json;
