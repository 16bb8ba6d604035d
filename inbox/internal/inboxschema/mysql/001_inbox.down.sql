DROP TABLE IF EXISTS {{dead_letter}};
DROP TABLE IF EXISTS {{versions}};
DROP TABLE IF EXISTS {{table}};
