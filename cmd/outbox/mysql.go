package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
)

// mysqlConfig turns --db mysql://user:pass@host:port/db?params into a
// go-sql-driver configuration (outboxmysql.ParseURL): query parameters are
// the driver's DSN parameters (tls, timeout, ...); parseTime and
// interpolateParams are on.
func mysqlConfig(raw string) (*mysql.Config, error) {
	cfg, err := outboxmysql.ParseURL(raw)
	var ue *outboxmysql.URLError
	if errors.As(err, &ue) {
		return nil, fmt.Errorf("invalid --db URL %s: %s", ue.URL, ue.Reason)
	}
	return cfg, err
}

// openMySQL connects to the MySQL or MariaDB that --db names, with at
// most maxConns connections, and checks that it answers.
func openMySQL(ctx context.Context, raw string, maxConns int32) (outboxdriver.Store, string, error) {
	cfg, err := mysqlConfig(raw)
	if err != nil {
		return nil, "", err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("invalid --db URL %s: %v", redact(raw), err)
	}
	db := sql.OpenDB(conn)
	if maxConns > 0 {
		// Headroom: a relay's lanes each hold a connection while their
		// batch is in flight, and lease upkeep must never wait for one.
		db.SetMaxOpenConns(int(maxConns) + 4)
	}
	db.SetConnMaxIdleTime(time.Minute)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, "", fmt.Errorf("cannot connect to MySQL/MariaDB at %s (database %q): %v; check --db and that MySQL/MariaDB is running",
			cfg.Addr, cfg.DBName, oneLine(err))
	}
	return &mysqlStore{outboxmysql.NewStore(db)}, cfg.DBName, nil
}

// mysqlStore closes the database the command opened.
type mysqlStore struct{ *outboxmysql.Store }

func (s *mysqlStore) Close() error { return s.DB().Close() }
