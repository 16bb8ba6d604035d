package relayd

// Opening a database and a sink from their URLs: what Open, a Fleet and
// every command of `outbox` share, so that the command line and an
// embedded relay accept the same URLs and say the same about bad ones.

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
	binlog "github.com/outboxkit/outbox/outboxmysql/cdc"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
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
	// Schema is the schema of a table whose configuration names none:
	// "public" on PostgreSQL, "main" on SQLite, the URL's database on
	// MySQL/MariaDB.
	Schema string
}

// Close closes the pool OpenDB opened.
func (d *DB) Close() {
	if d.Pool != nil {
		d.Pool.Close()
	}
	if d.SQL != nil {
		d.SQL.Close()
	}
}

// OpenDB opens the database raw names (postgres://, mysql:// or
// sqlite://; DBSchemes), chosen by the URL's scheme, with at most maxConns
// connections (0: the client's default), and checks that it answers. A
// bad URL or a database that does not answer is a one-line error that
// says what to check, with the URL's password hidden.
func OpenDB(ctx context.Context, raw string, maxConns int32) (*DB, error) {
	scheme, _, _ := strings.Cut(raw, "://")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		pool, err := openPostgres(ctx, raw, maxConns)
		if err != nil {
			return nil, err
		}
		st := outboxpgx.New(pool)
		return &DB{Store: st, Pool: pool, Scheme: "postgres", Schema: st.DefaultSchema()}, nil
	case "sqlite":
		db, err := sqlite(ctx, raw)
		if err != nil {
			return nil, err
		}
		st := outboxsqlite.New(db)
		return &DB{Store: st, SQL: db, Scheme: "sqlite", Schema: st.DefaultSchema()}, nil
	case "mysql":
		db, name, err := openMySQL(ctx, raw, maxConns)
		if err != nil {
			return nil, err
		}
		return &DB{Store: outboxmysql.New(db), SQL: db, Scheme: "mysql", Schema: name}, nil
	default:
		return nil, fmt.Errorf("database URL %s: unknown scheme %q; use postgres://, mysql:// or sqlite://", redact(raw), scheme)
	}
}

// openPostgres opens a pool on raw with at most maxConns connections (0:
// the default) and checks it answers.
func openPostgres(ctx context.Context, raw string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %v", redact(raw), unwrapAll(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "outbox"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %v", redact(raw), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to PostgreSQL at %s:%d (database %q): %v; check the database URL and that PostgreSQL is running",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, oneLine(err))
	}
	return pool, nil
}

// mySQLConfig turns mysql://user:pass@host:port/db?params into a
// go-sql-driver configuration (outboxmysql.ParseURL): query parameters are
// the driver's DSN parameters (tls, timeout, ...); parseTime and
// interpolateParams are on.
func mySQLConfig(raw string) (*mysql.Config, error) {
	cfg, err := outboxmysql.ParseURL(raw)
	var ue *outboxmysql.URLError
	if errors.As(err, &ue) {
		return nil, fmt.Errorf("invalid database URL %s: %s", ue.URL, ue.Reason)
	}
	return cfg, err
}

// openMySQL connects to the MySQL or MariaDB that raw names, with at most
// maxConns connections, checks that it answers, and returns the pool and
// the URL's database.
func openMySQL(ctx context.Context, raw string, maxConns int32) (*sql.DB, string, error) {
	cfg, err := mySQLConfig(raw)
	if err != nil {
		return nil, "", err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("invalid database URL %s: %v", redact(raw), err)
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
		return nil, "", fmt.Errorf("cannot connect to MySQL/MariaDB at %s (database %q): %v; check the database URL and that MySQL/MariaDB is running",
			cfg.Addr, cfg.DBName, oneLine(err))
	}
	return db, cfg.DBName, nil
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

// redact hides a password in a URL.
func redact(raw string) string { return confval.RedactURL(raw) }

func unwrapAll(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// oneLine keeps an error on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// cdcSource returns the log-tailing source of table t on db, after
// checking that the database can serve it (wal_level, the REPLICATION
// attribute, the table's migration): a one-line error says what to do
// when it cannot. Log tailing is PostgreSQL's only.
func cdcSource(ctx context.Context, db *DB, t outboxdriver.Table, cfg *cdc.Config) (outboxdriver.Source, error) {
	if db.Pool == nil {
		return nil, fmt.Errorf("log tailing (--source cdc) needs PostgreSQL; %s relays with --source poll", db.Scheme)
	}
	src, err := cdc.NewSource(db.Pool, t, cfg)
	if err != nil {
		return nil, err
	}
	// What is missing is made now, not at the first stream: writers in
	// message or insert + delete mode can write once Open returned.
	if cfg.NoCreate {
		err = src.Check(ctx)
	} else {
		err = src.Setup(ctx)
	}
	if err != nil {
		src.Close()
		return nil, err
	}
	return src, nil
}

// binlogSource opens log tailing of the MySQL/MariaDB binary log; the
// replication connection uses the database URL's server and account
// unless cfg names a DSN.
func binlogSource(db *DB, dbURL string, t outboxdriver.Table, cfg *binlog.Config) (outboxdriver.Source, error) {
	if db.Scheme != "mysql" {
		return nil, fmt.Errorf("binary log tailing (--source binlog) needs MySQL or MariaDB; %s relays with --source poll", db.Scheme)
	}
	if cfg.DSN == "" {
		mc, err := mySQLConfig(dbURL)
		if err != nil {
			return nil, err
		}
		cfg.DSN = mc.FormatDSN()
	}
	return binlog.NewSource(db.SQL, t, cfg)
}
