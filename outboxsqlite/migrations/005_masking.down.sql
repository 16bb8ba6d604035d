DROP TABLE IF EXISTS {{masking}};
