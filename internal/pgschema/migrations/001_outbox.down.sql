DROP TRIGGER IF EXISTS {{notify_trg}} ON {{table}};
DROP FUNCTION IF EXISTS {{notify_fn}}();
DROP TABLE IF EXISTS {{wakeup}};
DROP TABLE IF EXISTS {{dead_letter}};
DROP TABLE IF EXISTS {{table}};
