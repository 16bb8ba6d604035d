package main

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
)

// mysqlConfig turns --db mysql://user:pass@host:port/db?params into a
// go-sql-driver configuration. Query parameters are the driver's DSN
// parameters (tls, timeout, ...); parseTime and interpolateParams are on.
func mysqlConfig(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid --db URL %s: %v", redact(raw), unwrapAll(err))
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("invalid --db URL %s: %s", redact(raw), fmt.Sprintf(format, args...))
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return nil, bad("no host; use mysql://user:password@host:3306/database")
	}
	if port == "" {
		port = "3306"
	}
	db := u.Path
	if len(db) > 0 && db[0] == '/' {
		db = db[1:]
	}
	if db == "" {
		return nil, bad("no database; use mysql://user:password@host:3306/database")
	}
	if err := outboxdriver.ValidateIdent("database", db); err != nil {
		return nil, bad("%v", err)
	}
	// Parse the query as DSN parameters, so the driver checks them.
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, bad("%v", err)
	}
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", net.JoinHostPort(host, port), db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	q := u.Query()
	if !q.Has("parseTime") {
		cfg.ParseTime = true
	}
	if !q.Has("interpolateParams") {
		cfg.InterpolateParams = true // one round trip per statement
	}
	if !q.Has("timeout") {
		cfg.Timeout = 10 * time.Second
	}
	return cfg, nil
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
