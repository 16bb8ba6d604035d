-- Back to version 7: no log tailing state.
DROP TABLE IF EXISTS {{binlog}};
