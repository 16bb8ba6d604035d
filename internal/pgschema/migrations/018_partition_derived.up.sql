-- relays: from 18
-- (Relays before version 18 read the partition column, empty on rows
-- written from now on: they would skip those rows.)
-- The partition of a row is no longer stored: relays compute it from
-- aggregateid when they claim (the same hash over the same count of
-- partitions as the trigger of migration 17 and the generated column
-- before it, so every row keeps its partition). Why: the row trigger ran
-- on every insert of every business transaction, for a value only the
-- relay reads (docs/benchmarks.md). Relays of this version ignore the
-- column, so nothing a writer puts there moves a row into another
-- aggregate's partition.
--
-- The column stays, empty on rows written from now on: a relay of the
-- version before keeps relaying the rows that have one, and those without
-- wait until a relay of this version holds their partition (nothing lost,
-- nothing reordered; docs/operations.md says to roll the relays first).
LOCK TABLE {{table}} IN ACCESS EXCLUSIVE MODE;
DROP TRIGGER {{partition_trg}} ON {{table}};
DROP FUNCTION {{partition_fn}}();
