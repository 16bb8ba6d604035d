package outboxsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// TestPartitionColumn: the database computes the partition of every row
// from the aggregate id alone, with the hash partitionOf documents, for
// short, long and non-ASCII ids; the same aggregate always lands in the
// same partition, and ids spread over every partition.
func TestPartitionColumn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const parts = 64
	tb := outboxdriver.Table{Schema: Schema, Name: "outbox"}
	if _, err := New(db).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	ids := []string{"1", "42", "a", "order-42", "ünïcødé", "日本語の集約", "emoji-🦫", strings.Repeat("x", 31),
		strings.Repeat("y", 1024), strings.Repeat("z", 1025), strings.Repeat("0123456789", 200) + "tail"}
	for n := range 1000 {
		ids = append(ids, fmt.Sprint("agg-", n))
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ins, err := tx.PrepareContext(ctx, `INSERT INTO "main"."outbox" (id, aggregatetype, aggregateid, type) VALUES (?, 'a', ?, 't')`)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		// Twice each: the same aggregate must land in the same partition.
		for k := range 2 {
			if _, err := ins.ExecContext(ctx, fmt.Sprint(i, "-", k), id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `SELECT aggregateid, min(partition), max(partition) FROM "main"."outbox" GROUP BY aggregateid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	used := map[int]int{}
	seen := 0
	for rows.Next() {
		var id string
		var lo, hi int
		if err := rows.Scan(&id, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		seen++
		if lo != hi {
			t.Fatalf("aggregate %q in partitions %d and %d", id, lo, hi)
		}
		if want := partitionOf(id, parts); lo != want {
			t.Fatalf("aggregate %q in partition %d; the documented hash gives %d", id, lo, want)
		}
		used[lo]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(ids) {
		t.Fatalf("read %d aggregates, wrote %d", seen, len(ids))
	}
	if len(used) != parts {
		t.Fatalf("%d aggregates used %d of %d partitions; want every one", len(ids), len(used), parts)
	}
	for p, n := range used {
		// 1011 ids over 64 partitions: 16 on average.
		if n < 4 || n > 40 {
			t.Errorf("partition %d holds %d of %d aggregates; want an even spread (16 on average)", p, n, len(ids))
		}
	}
}

// TestPartitionColumnNeedsNoCustomFunction: the schema uses built-in
// functions only, so a connection that knows nothing of this package (as
// the sqlite3 shell or another language) reads and inserts rows.
func TestPartitionColumnNeedsNoCustomFunction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "plain.db")
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := New(db).Migrate(ctx, outboxdriver.Table{}, nil); err != nil {
		t.Fatal(err)
	}
	plain, err := sql.Open("sqlite", path) // no settings at all
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.ExecContext(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES ('0190a0d0-0000-7000-8000-000000000001', 'order', '42', 'OrderPlaced', '{"orderId": 42}')`); err != nil {
		t.Fatalf("plain INSERT of the contract's columns: %v", err)
	}
	var part int
	var created string
	if err := plain.QueryRowContext(ctx, `SELECT partition, created_at FROM outbox`).Scan(&part, &created); err != nil {
		t.Fatal(err)
	}
	if want := partitionOf("42", outboxdriver.DefaultPartitions); part != want {
		t.Fatalf("partition %d, want %d", part, want)
	}
	if at := parseTime(created); at.IsZero() || time.Since(at).Abs() > time.Hour {
		t.Fatalf("created_at %q, want the time of the insert in %q", created, timeLayout)
	}
	if _, err := plain.ExecContext(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES ('0190a0d0-0000-7000-8000-000000000002', 'order', '42', 'OrderPlaced', 'not json')`); err == nil {
		t.Fatal("a payload that is not JSON was accepted; want the CHECK to refuse it (payload_raw holds other formats)")
	}
}
