package console_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// consoleStore is what the console needs of a driver, and what the tests
// use to look behind it.
type consoleStore = outboxdriver.Store

// databases are the databases the console's tests run on.
var databases = []string{"postgres", "mysql", "sqlite"}

// onEveryDB runs fn against a fresh rig on each database, in parallel.
func onEveryDB(t *testing.T, o *rigOptions, fn func(t *testing.T, r *rig)) {
	t.Helper()
	for _, db := range databases {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			fn(t, newRigOn(t, db, o))
		})
	}
}

// fixtures put rows straight into a database's tables, as the relay or an
// earlier run would have left them.
type fixtures interface {
	addDeadLetters(t testing.TB, tb outboxdriver.Table, rows ...testenv.DeadLetterRow) []string
	addPublished(t testing.TB, tb outboxdriver.Table, rows ...testenv.PublishedRow) []string
	// requestStates is every request's id and state.
	requestStates(t testing.TB, tb outboxdriver.Table) string
	// expire moves a request's expiry into the past.
	expire(t testing.TB, tb outboxdriver.Table, id string)
	// pending lists the unpublished events in the order the relay claims
	// them.
	pending(t testing.TB, tb outboxdriver.Table) []pendingEvent
	// tamper fails t unless the database refuses to update or delete an
	// audit row, saying the audit is append-only.
	tamper(t testing.TB, tb outboxdriver.Table)
}

// pendingEvent is an unpublished event as pending lists it.
type pendingEvent struct {
	id, aggregateID  string
	headers, payload string // JSON text
}

func scanPending(t testing.TB, rows interface {
	Next() bool
	Scan(...any) error
	Err() error
}) []pendingEvent {
	t.Helper()
	var out []pendingEvent
	for rows.Next() {
		var e pendingEvent
		if err := rows.Scan(&e.id, &e.aggregateID, &e.headers, &e.payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// openDB opens a fresh migrated table on the database named.
func openDB(t *testing.T, ctx context.Context, db string) (consoleStore, outboxdriver.Table, fixtures, *pgxpool.Pool) {
	t.Helper()
	switch db {
	case "postgres":
		pool := testenv.Pool(t)
		return outboxpgx.New(pool), testenv.Table(t, pool), pgFixtures{pool}, pool
	case "mysql":
		name := testenv.MySQLDatabase(t, testenv.MySQL(t, ""), "console")
		sdb := testenv.MySQL(t, name)
		return outboxmysql.New(sdb), outboxdriver.Table{Schema: name, Name: "outbox"}, sqlFixtures{sdb, "2006-01-02 15:04:05.000000"}, nil
	case "sqlite":
		sdb, err := outboxsqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sdb.Close() })
		return outboxsqlite.New(sdb), outboxdriver.Table{Schema: outboxsqlite.Schema, Name: "outbox"}, sqlFixtures{sdb, "2006-01-02 15:04:05.000"}, nil
	}
	t.Fatalf("no database %q", db)
	return nil, outboxdriver.Table{}, nil, nil
}

type pgFixtures struct{ pool *pgxpool.Pool }

func (f pgFixtures) addDeadLetters(t testing.TB, tb outboxdriver.Table, rows ...testenv.DeadLetterRow) []string {
	return testenv.AddDeadLetters(t, f.pool, tb, rows...)
}

func (f pgFixtures) addPublished(t testing.TB, tb outboxdriver.Table, rows ...testenv.PublishedRow) []string {
	return testenv.AddPublished(t, f.pool, tb, rows...)
}

func (f pgFixtures) requestStates(t testing.TB, tb outboxdriver.Table) string {
	t.Helper()
	var reqs string
	if err := f.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(id || ':' || state, ' ' ORDER BY id), '') FROM `+tb.Qualified("_requests")).Scan(&reqs); err != nil {
		t.Fatal(err)
	}
	return reqs
}

func (f pgFixtures) expire(t testing.TB, tb outboxdriver.Table, id string) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), `UPDATE `+tb.Qualified("_requests")+` SET expires_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// sqlFixtures are the fixtures of MySQL and SQLite: the same SQL, with
// times written in the layout of the database's time columns.
type sqlFixtures struct {
	db     *sql.DB
	layout string
}

func (f sqlFixtures) name(tb outboxdriver.Table, suffix string) string {
	return "`" + tb.Schema + "`.`" + tb.Name + suffix + "`"
}

func (f sqlFixtures) at(d time.Duration) string { return time.Now().UTC().Add(-d).Format(f.layout) }

func (f sqlFixtures) addDeadLetters(t testing.TB, tb outboxdriver.Table, rows ...testenv.DeadLetterRow) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for _, r := range rows {
		// A fresh position: one the outbox hands out, and never again.
		id := uuid.Must(uuid.NewV7()).String()
		var seq int64
		if _, err := f.db.ExecContext(ctx, `INSERT INTO `+f.name(tb, "")+` (id, aggregatetype, aggregateid, type) VALUES (?, 'x', 'x', 'x')`, id); err != nil {
			t.Fatal(err)
		}
		if err := f.db.QueryRowContext(ctx, `SELECT seq FROM `+f.name(tb, "")+` WHERE id = ?`, id).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.ExecContext(ctx, `DELETE FROM `+f.name(tb, "")+` WHERE id = ?`, id); err != nil {
			t.Fatal(err)
		}
		var payload any
		if r.Payload != "" {
			payload = r.Payload
		}
		headers := r.Headers
		if headers == "" {
			headers = "{}"
		}
		if _, err := f.db.ExecContext(ctx, `INSERT INTO `+f.name(tb, "_dead_letter")+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, attempts, last_error, held, dead_lettered_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, id, r.AggregateType, r.AggregateID, r.Type, payload, seq, f.at(time.Minute), headers, r.Attempts, r.LastError, r.Held, f.at(0)); err != nil {
			t.Fatalf("add dead letter %+v: %v", r, err)
		}
		if r.Held {
			if _, err := f.db.ExecContext(ctx, `INSERT INTO `+f.name(tb, "_held")+` (aggregatetype, aggregateid, seq, event_id, reason) VALUES (?, ?, ?, ?, 'dead-lettered')`,
				r.AggregateType, r.AggregateID, seq, id); err != nil {
				t.Fatalf("hold %s/%s: %v", r.AggregateType, r.AggregateID, err)
			}
		}
		ids = append(ids, id)
	}
	return ids
}

func (f sqlFixtures) addPublished(t testing.TB, tb outboxdriver.Table, rows ...testenv.PublishedRow) []string {
	t.Helper()
	var ids []string
	for _, r := range rows {
		id := uuid.Must(uuid.NewV7()).String()
		var payload any
		if r.Payload != "" {
			payload = r.Payload
		}
		if _, err := f.db.ExecContext(context.Background(), `INSERT INTO `+f.name(tb, "")+` (id, aggregatetype, aggregateid, type, payload, published_at) VALUES (?, ?, ?, ?, ?, ?)`,
			id, r.AggregateType, r.AggregateID, r.Type, payload, f.at(r.Ago)); err != nil {
			t.Fatalf("add a published event: %v", err)
		}
		ids = append(ids, id)
	}
	return ids
}

func (f sqlFixtures) requestStates(t testing.TB, tb outboxdriver.Table) string {
	t.Helper()
	rows, err := f.db.QueryContext(context.Background(), `SELECT id, state FROM `+f.name(tb, "_requests"))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var all []string
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		all = append(all, id+":"+state)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(all)
	return strings.Join(all, " ")
}

func (f sqlFixtures) expire(t testing.TB, tb outboxdriver.Table, id string) {
	t.Helper()
	if _, err := f.db.ExecContext(context.Background(), `UPDATE `+f.name(tb, "_requests")+` SET expires_at = ? WHERE id = ?`, f.at(time.Second), id); err != nil {
		t.Fatal(err)
	}
}

func (f pgFixtures) pending(t testing.TB, tb outboxdriver.Table) []pendingEvent {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT id::text, aggregateid, headers::text, coalesce(payload::text, '') FROM `+tb.Qualified("")+` WHERE published_at IS NULL ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	return scanPending(t, rows)
}

func (f sqlFixtures) pending(t testing.TB, tb outboxdriver.Table) []pendingEvent {
	t.Helper()
	rows, err := f.db.QueryContext(context.Background(), `SELECT id, aggregateid, headers, coalesce(payload, '') FROM `+f.name(tb, "")+` WHERE published_at IS NULL ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	return scanPending(t, rows)
}

func checkRefused(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), "append-only") {
		t.Fatalf("%s of an audit row: %v; want the database's refusal (append-only)", what, err)
	}
}

func (f pgFixtures) tamper(t testing.TB, tb outboxdriver.Table) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), `UPDATE `+tb.Qualified("_audit")+` SET actor = 'mallory'`)
	checkRefused(t, "UPDATE", err)
	_, err = f.pool.Exec(context.Background(), `DELETE FROM `+tb.Qualified("_audit"))
	checkRefused(t, "DELETE", err)
}

func (f sqlFixtures) tamper(t testing.TB, tb outboxdriver.Table) {
	t.Helper()
	_, err := f.db.ExecContext(context.Background(), `UPDATE `+f.name(tb, "_audit")+` SET actor = 'mallory'`)
	checkRefused(t, "UPDATE", err)
	_, err = f.db.ExecContext(context.Background(), `DELETE FROM `+f.name(tb, "_audit"))
	checkRefused(t, "DELETE", err)
}
