// Package open opens an outbox database and a broker sink from their URLs:
// what `outbox relay` (and every other command) and package relayd's Open
// share, so that the command line and an embedded relay accept the same
// URLs and say the same about bad ones.
package open

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// DBSchemes lists the database URL forms, for messages.
const DBSchemes = "postgres://user@host:5432/db, mysql://user:pass@host:3306/db or sqlite://path/to/file.db"

// DB is an outbox database opened from a URL, with the connection pool
// opened for it.
type DB struct {
	// Store is the database's driver.
	Store outboxdriver.Store
	// Pool is the PostgreSQL pool (nil for other databases); SQL is the
	// MySQL or SQLite pool (nil for PostgreSQL).
	Pool *pgxpool.Pool
	SQL  *sql.DB
	// Scheme is "postgres", "mysql" or "sqlite".
	Scheme string
}

// Close closes the pool Open opened.
func (d *DB) Close() {
	if d.Pool != nil {
		d.Pool.Close()
	}
	if d.SQL != nil {
		d.SQL.Close()
	}
}

// Database opens the database raw names, chosen by the URL's scheme, with
// at most maxConns connections (0: the client's default), and checks that
// it answers.
func Database(ctx context.Context, raw string, maxConns int32) (*DB, error) {
	scheme, _, _ := strings.Cut(raw, "://")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		pool, err := Postgres(ctx, raw, maxConns)
		if err != nil {
			return nil, err
		}
		return &DB{Store: outboxpgx.New(pool), Pool: pool, Scheme: "postgres"}, nil
	case "sqlite":
		db, err := sqlite(ctx, raw)
		if err != nil {
			return nil, err
		}
		return &DB{Store: outboxsqlite.New(db), SQL: db, Scheme: "sqlite"}, nil
	case "mysql":
		db, err := mySQL(ctx, raw, maxConns)
		if err != nil {
			return nil, err
		}
		return &DB{Store: outboxmysql.New(db), SQL: db, Scheme: "mysql"}, nil
	default:
		return nil, fmt.Errorf("database URL %s: unknown scheme %q; use postgres://, mysql:// or sqlite://", Redact(raw), scheme)
	}
}

// Postgres opens a pool on raw with at most maxConns connections (0: the
// default) and checks it answers.
func Postgres(ctx context.Context, raw string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %v", Redact(raw), unwrapAll(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "outbox"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %v", Redact(raw), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to PostgreSQL at %s:%d (database %q): %v; check the database URL and that PostgreSQL is running",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, OneLine(err))
	}
	return pool, nil
}

// MySQLConfig turns mysql://user:pass@host:port/db?params into a
// go-sql-driver configuration (outboxmysql.ParseURL): query parameters are
// the driver's DSN parameters (tls, timeout, ...); parseTime and
// interpolateParams are on.
func MySQLConfig(raw string) (*mysql.Config, error) {
	cfg, err := outboxmysql.ParseURL(raw)
	var ue *outboxmysql.URLError
	if errors.As(err, &ue) {
		return nil, fmt.Errorf("invalid database URL %s: %s", ue.URL, ue.Reason)
	}
	return cfg, err
}

// mySQL connects to the MySQL or MariaDB that raw names, with at most
// maxConns connections, and checks that it answers.
func mySQL(ctx context.Context, raw string, maxConns int32) (*sql.DB, error) {
	cfg, err := MySQLConfig(raw)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %v", Redact(raw), err)
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
		return nil, fmt.Errorf("cannot connect to MySQL/MariaDB at %s (database %q): %v; check the database URL and that MySQL/MariaDB is running",
			cfg.Addr, cfg.DBName, OneLine(err))
	}
	return db, nil
}

// sqlite opens the database file a sqlite:// URL names:
// sqlite://path/to/file.db is relative to the working directory,
// sqlite:///abs/path/file.db absolute.
func sqlite(ctx context.Context, raw string) (*sql.DB, error) {
	_, path, _ := strings.Cut(raw, "://")
	if path == "" {
		return nil, fmt.Errorf("database URL %s: name the database file, e.g. sqlite://app.db or sqlite:///var/lib/app/app.db", raw)
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("database URL %s: a sqlite:// URL takes a file path only, without ? or #", raw)
	}
	return outboxsqlite.Open(ctx, path)
}

// Redact hides a password in a URL.
func Redact(raw string) string { return confval.RedactURL(raw) }

func unwrapAll(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// OneLine keeps an error on one line.
func OneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
