DROP TABLE {{dead_letter}};
DROP TABLE {{versions}};
DROP TABLE {{table}};
