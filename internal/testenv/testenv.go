// Package testenv connects tests to the real services on the machine
// (PostgreSQL, NATS JetStream) and gives each test its own schema. A test
// that cannot reach a service fails and says how to start it; it never
// skips.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Env variables that point tests at other services.
const (
	EnvDatabase = "OUTBOX_TEST_DATABASE_URL"
	EnvNATS     = "OUTBOX_TEST_NATS_URL"
)

const startPostgres = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"

// DatabaseURL is the PostgreSQL the tests use.
func DatabaseURL() string {
	if u := os.Getenv(EnvDatabase); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// NATSURL is the NATS server (with JetStream) the tests use.
func NATSURL() string {
	if u := os.Getenv(EnvNATS); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// NATSHelp says how to start NATS.
const NATSHelp = "start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log"

// Pool returns a pool on the test database, closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, DatabaseURL())
	if err != nil {
		t.Fatalf("PostgreSQL URL %s: %v", DatabaseURL(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("cannot reach PostgreSQL at %s (set %s to use another): %v; %s", DatabaseURL(), EnvDatabase, err, startPostgres)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Name returns a fresh lower-case identifier with the given prefix.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return strings.ToLower(prefix) + "_" + hex.EncodeToString(b)
}

// Table returns a table in a new, empty schema that is dropped when the test
// ends. Nothing is migrated.
func Table(t testing.TB, pool *pgxpool.Pool) outboxdriver.Table {
	t.Helper()
	schema := Name("t")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+outboxdriver.QuoteIdent(schema)+` CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	return outboxdriver.Table{Schema: schema, Name: "outbox"}
}

// Hex returns 12 random hex digits, for names that must not collide.
func Hex(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// Context returns a context that ends after d or when the test ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// NeedProcsChoice fails the test where the relay's choice of GOMAXPROCS
// cannot be seen: GOMAXPROCS set in the environment, or one CPU.
func NeedProcsChoice(t *testing.T) {
	t.Helper()
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		t.Fatal("GOMAXPROCS is set in the environment: unset it, this test checks the relay's own choice")
	}
	n := runtime.NumCPU()
	if n < 2 {
		t.Fatalf("%d CPU: one P is the default here, so the relay's narrowing cannot be seen; run on at least 2 CPUs", n)
	}
}

// PoolAs creates a login role named after prefix, runs grants (each a
// statement with %s where the role's name goes) through admin, and returns
// the role's name and a pool that connects as it. The role and what it owns
// go when the test ends.
func PoolAs(t testing.TB, admin *pgxpool.Pool, prefix string, grants ...string) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	role := Name(prefix)
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), `DROP OWNED BY `+role)
		admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	for _, g := range grants {
		if _, err := admin.Exec(ctx, strings.ReplaceAll(g, "%s", role)); err != nil {
			t.Fatalf("%s: %v", g, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return role, pool
}
