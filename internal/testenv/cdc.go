package testenv

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CDCDatabase is the database the log-tailing tests use, next to the
// test database. A replication slot decodes every transaction of its
// database, and PostgreSQL can make a slot that cannot decode a
// transaction of another session's (it fails with "could not map
// filenode") when that session created a table and wrote to it while the
// slot was being made (docs/cdc.md, Known limits): the other tests' DDL
// stays out of this database, and the log-tailing tests take turns for
// theirs (CDCTurn).
const CDCDatabase = "outbox_cdc_test"

var cdcCreated sync.Once

// CDCPool returns a pool on CDCDatabase, created when missing, closed
// when the test ends.
func CDCPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	admin := Pool(t) // fails with how to start PostgreSQL when it is down
	cdcCreated.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.Exec(ctx, `CREATE DATABASE `+CDCDatabase)
		var pgErr *pgconn.PgError
		// 42P04: it exists; 23505: another process created it just now.
		if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")) {
			t.Fatalf("create database %s: %v", CDCDatabase, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = CDCDatabase
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// CDCDatabaseURL is the URL of CDCDatabase: the test database's URL with
// another path.
func CDCDatabaseURL(t testing.TB) string {
	t.Helper()
	CDCPool(t) // creates it
	u, err := url.Parse(DatabaseURL())
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("cannot derive the URL of %s from %s: use a postgres:// URL", CDCDatabase, DatabaseURL())
	}
	u.Path = "/" + CDCDatabase
	return u.String()
}

// CDCTurn runs fn while no other test, in any process, runs DDL or
// creates a replication slot in CDCDatabase through CDCTurn: a session
// advisory lock of pool's database. Begin no transaction that stays open
// while waiting for a turn: making a slot waits for every transaction
// open on the server, so the test in its turn would wait for that one,
// and that one for the turn (begin it in fn instead).
func CDCTurn(t testing.TB, pool *pgxpool.Pool, fn func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const key = 0x6f7574626f78 // "outbox"
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(key)); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(key))
	fn()
}

// DropSlotAtEnd runs down (a migration down that drops t's replication
// slot) when the test ends, in CDCTurn, again and again for up to 30
// seconds: a stopped or killed relay's walsender may hold the slot a
// moment longer. Register it before the relays, so that it runs after
// them (cleanups run last-in first-out).
func DropSlotAtEnd(t testing.TB, pool *pgxpool.Pool, down func(ctx context.Context) error) {
	t.Cleanup(func() {
		CDCTurn(t, pool, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for {
				err := down(ctx)
				if err == nil {
					return
				}
				if ctx.Err() != nil {
					t.Errorf("migrate down (drops the slot): %v", err)
					return
				}
				time.Sleep(50 * time.Millisecond) // polling with a deadline
			}
		})
	})
}
