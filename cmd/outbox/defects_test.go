package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxsqlite"
	"github.com/outboxkit/outbox/relay"
)

func TestVersionNamesModuleCommitAndGo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, stderr, code := run(t, nil, args...)
		if code != 0 {
			t.Fatalf("%v: exit code %d: %s", args, code, stderr)
		}
		for _, want := range []string{"outbox ", "module github.com/outboxkit/outbox\n", "commit ", "go     go1."} {
			if !strings.Contains(out, want) {
				t.Errorf("%v printed %q; want it to contain %q", args, out, want)
			}
		}
	}
}

// Zero never stands for a flag's default: a value passed is used as given
// or refused with its range (docs/cli.md). None of these reach a database.
func TestZeroValuesAreRefusedNotDefaults(t *testing.T) {
	t.Parallel()
	db := []string{"--db", "postgres://postgres@127.0.0.1:1/none"}
	relay := append([]string{"relay", "--sink", "stdout:"}, db...)
	for _, c := range []struct {
		args []string
		want string
	}{
		{append([]string{"migrate", "--partitions", "0"}, db...), "--partitions 0: use 1 to 4096"},
		{append([]string{"migrate", "--partitions", "5000"}, db...), "--partitions 5000: use 1 to 4096"},
		{append(relay, "--batch", "0"), "--batch 0: use 1 to 100000"},
		{append(relay, "--lanes", "0"), "--lanes 0: use 1 to 64"},
		{append(relay, "--poll-interval", "0"), "--poll-interval 0s: use at least 1ms"},
		{append(relay, "--lease-ttl", "0"), "--lease-ttl 0s: use at least 300ms"},
		{append(relay, "--max-attempts", "0"), "--max-attempts 0: use at least 1"},
		{append(relay, "--retry-base", "0"), "--retry-base 0s: use at least 1ms"},
		{append(relay, "--retry-max", "0"), "--retry-max 0s: use at least --retry-base"},
		{append(relay, "--webhook-timeout", "0"), "--webhook-timeout 0s: use at least 1ms"},
		{append(relay, "--keep-for", "-1s"), "--keep-for -1s: must not be negative"},
		{append(relay, "--partition-lock-timeout", "0"), "--partition-lock-timeout 0s: use at least 1ms"},
		{append(relay, "--redis-maxlen", "-1"), "--redis-maxlen -1: must not be negative"},
		{[]string{"demo", "--orders", "0"}, "--orders 0: use 1 to 1000000"},
		{[]string{"demo", "--writers", "0"}, "--writers 0: use 1 to 64"},
		{[]string{"demo", "--rate", "0"}, "--rate 0: use 1 to 100000"},
		{append([]string{"dlq", "list", "--limit", "0"}, db...), "--limit 0: use 1 to"},
		{append([]string{"dlq", "audit", "--limit", "0"}, db...), "--limit 0: use 1 to"},
		{append([]string{"bench", "--lanes", "0"}, db...), "--lanes 0: use 1 to 64"},
		{append([]string{"migrate", "--force", "--down", "3"}, db...), "--force goes with the outbox tables' migration"},
	} {
		t.Run(c.want, func(t *testing.T) {
			t.Parallel()
			failsWithOneLine(t, []string{"OUTBOX_DB=", "OUTBOX_SINK="}, c.want, c.args...)
		})
	}
}

// The relay's bounds are checked by the relay (relay.Config.Validate)
// and its error names the flag, in the words the command has always
// used: each line here is what `outbox relay` prints after "outbox: ".
func TestRelayBoundsNameTheFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		set  func(*relay.Config)
		want string
	}{
		{func(c *relay.Config) { c.BatchSize = 100_001 }, "--batch 100001: use 1 to 100000"},
		{func(c *relay.Config) { c.Lanes = 65 }, "--lanes 65: use 1 to 64"},
		{func(c *relay.Config) { c.PollInterval = time.Microsecond }, "--poll-interval 1µs: use at least 1ms"},
		{func(c *relay.Config) { c.Linger = -time.Millisecond }, "--linger -1ms: must not be negative"},
		{func(c *relay.Config) { c.Linger = 2 * time.Second }, "--linger 2s: use at most 1s"},
		{func(c *relay.Config) { c.LeaseTTL = 299 * time.Millisecond }, "--lease-ttl 299ms: use at least 300ms (leave the flag out for its default)"},
		{func(c *relay.Config) { c.RetryBase = 0 }, "--retry-base 0s: use at least 1ms (leave the flag out for its default)"},
		{func(c *relay.Config) { c.RetryBase, c.RetryMax = 20*time.Millisecond, 10*time.Millisecond }, "--retry-max 10ms: use at least --retry-base (20ms)"},
		{func(c *relay.Config) { c.MaxAttempts = -3 }, "--max-attempts -3: use at least 1 (leave the flag out for its default)"},
		{func(c *relay.Config) { c.CleanupAfter = -time.Second }, "--keep-for -1s: must not be negative"},
		{func(c *relay.Config) { c.PartitionLockTimeout = 500 * time.Microsecond }, "--partition-lock-timeout 500µs: use at least 1ms (leave the flag out for its default)"},
		{func(c *relay.Config) { c.PartitionLockTimeout = 2 * time.Minute }, "--partition-lock-timeout 2m0s: use at most 1m0s"},
		// A field without a flag keeps the relay's wording.
		{func(c *relay.Config) { c.CleanupBatch = 0 }, "relay: Config.CleanupBatch 0: use at least 1"},
	} {
		t.Run(c.want, func(t *testing.T) {
			t.Parallel()
			cfg := relay.Config{}.WithDefaults()
			if err := relayConfigFlags().check(cfg); err != nil {
				t.Fatalf("the relay's defaults: %v", err)
			}
			c.set(&cfg)
			if err := relayConfigFlags().check(cfg); err == nil || err.Error() != c.want {
				t.Fatalf("check: %v, want %q", err, c.want)
			}
		})
	}
}

func TestBenchSaysItIsPostgreSQLOnly(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"mysql://root:secret@127.0.0.1:3306/test", "sqlite://bench.db"} {
		failsWithOneLine(t, nil, "bench runs on PostgreSQL only", "bench", "--db", url)
	}
}

// migrate --partitions on an existing table with another count says the
// count cannot change, and exits non-zero; the same count is a no-op.
func TestMigratePartitionsCannotChange(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	flags := []string{"migrate", "--db", dbURL(), "--schema", tb.Schema, "--table", tb.Name}
	if _, stderr, code := run(t, nil, append(flags, "--partitions", "8")...); code != 0 {
		t.Fatalf("migrate --partitions 8: %s", stderr)
	}
	failsWithOneLine(t, nil, "already has 8 partitions, and the count is fixed when the table is created; it cannot change", append(flags, "--partitions", "16")...)
	if out, stderr, code := run(t, nil, append(flags, "--partitions", "8")...); code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate --partitions 8 again: code %d, %q %q", code, out, stderr)
	}
}

// migrate --down 0 refuses to drop a table that still holds events,
// saying how many, unless --force.
func TestMigrateDownZeroRefusesToDropEvents(t *testing.T) {
	t.Parallel()
	// Each subtest makes its own context: a parallel subtest may wait long
	// for its turn, and its time starts when it runs.
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t, 60*time.Second)
		pool := testenv.Pool(t)
		tb := testenv.Table(t, pool)
		flags := []string{"--db", dbURL(), "--schema", tb.Schema, "--table", tb.Name}
		checkDownZero(t, flags, func(n int) {
			for range n {
				if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
					VALUES (gen_random_uuid(), 'order', '42', 'OrderPlaced', '{}')`); err != nil {
					t.Fatal(err)
				}
			}
		}, func() bool {
			var exists bool
			if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tb.Qualified("")).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			return exists
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t, 60*time.Second)
		path := filepath.Join(t.TempDir(), "app.db")
		flags := []string{"--db", "sqlite://" + path}
		var db *sql.DB
		open := func() *sql.DB {
			if db == nil {
				var err error
				if db, err = outboxsqlite.Open(ctx, path); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
			}
			return db
		}
		checkDownZero(t, flags, func(n int) {
			for range n {
				if _, err := open().ExecContext(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
					VALUES (lower(hex(randomblob(16))), 'order', '42', 'OrderPlaced', '{}')`); err != nil {
					t.Fatal(err)
				}
			}
		}, func() bool {
			var n int
			if err := open().QueryRowContext(context.Background(), `SELECT count(*) FROM sqlite_master WHERE name = 'outbox'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1
		})
	})
}

// checkDownZero migrates, inserts events with insert, and checks that
// --down 0 refuses with the count, and that --force drops the table.
func checkDownZero(t *testing.T, flags []string, insert func(n int), tableExists func() bool) {
	t.Helper()
	if _, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	insert(3)
	down := append([]string{"migrate", "--down", "0"}, flags...)
	failsWithOneLine(t, nil, "--down 0 would drop", down...)
	_, stderr, _ := run(t, nil, down...)
	for _, want := range []string{"3 unpublished event(s)", "0 dead letter(s)", "--force"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("refusal %q does not say %q", stderr, want)
		}
	}
	if !tableExists() {
		t.Fatal("the refused --down 0 dropped the table")
	}
	if _, stderr, code := run(t, nil, append(down, "--force")...); code != 0 {
		t.Fatalf("--down 0 --force: %s", stderr)
	}
	if tableExists() {
		t.Fatal("--down 0 --force left the table")
	}
}
