package main

// Least privilege (docs/security.md): outbox grants gives each database
// role exactly its job, and every role but the owner is refused what is
// not its job, the audit above all. Each role connects for real: the
// writer writes, a relay on the relay's role drains, the operations run on
// the console's role, the owner prunes; every forbidden statement is
// refused with the database's own refusal.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// jobSink publishes every event but those of aggregates named poison-*,
// which it refuses for good (so that the relay dead-letters them).
type jobSink struct {
	mu        sync.Mutex
	published map[string]int // by event id
}

func (s *jobSink) Publish(_ context.Context, msgs []sink.Message) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if strings.HasPrefix(string(m.Key), "poison") {
			errs[i] = sink.Permanent(errors.New("refused by the test sink"))
			continue
		}
		s.published[m.ID]++
	}
	return errs
}

func (s *jobSink) Close() error { return nil }

func (s *jobSink) has(ids []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.published[id] == 0 {
			return fmt.Errorf("event %s not published yet (%d published)", id, len(s.published))
		}
	}
	return nil
}

// jobEvents are what the writer writes: events that flow (one of them
// delayed into the past, so written with deliver_at), and two events of
// each of three aggregates the sink refuses.
func jobEvents() (flow, poison []outbox.Event) {
	for i := range 6 {
		e := outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("ok-%d", i%3), Type: "OrderPlaced", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		if i == 5 {
			e.DeliverAt = time.Now().Add(-time.Second)
		}
		flow = append(flow, e)
	}
	for _, agg := range []string{"poison-a", "poison-b", "poison-c"} {
		for i := range 2 {
			poison = append(poison, outbox.Event{AggregateType: "order", AggregateID: agg, Type: "OrderPlaced", Payload: []byte(fmt.Sprintf(`{"n":%d,"card":"x"}`, i))})
		}
	}
	return flow, poison
}

// ids gives events ids (the writer would) and returns them.
func ids(evs []outbox.Event) []string {
	out := make([]string, len(evs))
	for i := range evs {
		evs[i].ID = uuid.Must(uuid.NewV7()).String()
		out[i] = evs[i].ID
	}
	return out
}

// drain runs a relay on src until the sink has every flowing event and
// the relay has dead-lettered the first event of each poison aggregate.
func drain(t *testing.T, ctx context.Context, src outboxdriver.Source, flow []string, deadLetters func() (int64, error)) {
	t.Helper()
	router, err := route.New(&route.Config{})
	if err != nil {
		t.Fatal(err)
	}
	snk := &jobSink{published: map[string]int{}}
	rl, err := relay.New(src, snk, &relay.Config{
		BatchSize: 10, LeaseTTL: 3 * time.Second, PollInterval: 20 * time.Millisecond, Router: router,
		CleanupAfter: time.Hour, Logger: slog.New(slog.NewTextHandler(&testenv.Buffer{}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatalf("relay start with the relay's grants: %v", err)
	}
	await.Eventually(t, 60*time.Second, func() error {
		if err := snk.has(flow); err != nil {
			return err
		}
		n, err := deadLetters()
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			return fmt.Errorf("%d dead letters, want the 3 poison events that came first", n)
		}
		return nil
	})
	if err := rl.Stop(ctx); err != nil {
		t.Fatalf("relay stop: %v", err)
	}
}

// consoleJob runs the operations of package ops on the console's Store and
// checks each works: overview, dead letters, held aggregates, failure
// groups, pause and resume, samples, retry, discard, a repair and a replay
// (each approved by a second person and carried out), the audit.
func consoleJob(t *testing.T, ctx context.Context, st outboxdriver.Store, tb outboxdriver.Table) {
	t.Helper()
	o, err := ops.New(st, tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	viewer := ops.Actor{Name: "vera", Role: ops.Viewer}
	operator := ops.Actor{Name: "otto", Role: ops.Operator}
	approver := ops.Actor{Name: "anna", Role: ops.Approver}
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("console, %s, with the console's grants: %v", what, err)
		}
	}
	_, err = o.Overview(ctx, viewer)
	step("overview", err)
	step("sample", o.Sample(ctx))
	_, err = o.Insight(ctx, viewer, time.Hour)
	step("insight", err)
	page, err := o.DeadLetters(ctx, viewer, outboxdriver.DeadLetterQuery{Limit: 10})
	step("list dead letters", err)
	if len(page.DeadLetters) != 3 {
		t.Fatalf("console: %d dead letters, want 3", len(page.DeadLetters))
	}
	byAgg := map[string]string{}
	for _, dl := range page.DeadLetters {
		byAgg[dl.AggregateID] = dl.ID
	}
	_, err = o.MaskPaths(ctx, viewer)
	step("list the masked paths", err)
	_, err = o.DeadLetter(ctx, viewer, byAgg["poison-a"])
	step("show a dead letter", err)
	// Only the owner changes the masking stored with the table.
	if _, err := o.AddMaskPath(ctx, operator, outboxdriver.MaskPath{Path: "card"}, "x"); err == nil {
		t.Errorf("the console stored a masked path; want it refused: only the owner changes the masking")
	}
	held, err := o.Held(ctx, viewer, 10)
	step("list held aggregates", err)
	if len(held) != 3 {
		t.Fatalf("console: %d held aggregates, want 3", len(held))
	}
	_, err = o.FailureGroups(ctx, viewer, 10)
	step("failure groups", err)
	all := outboxdriver.PauseScope{Kind: outboxdriver.PauseAll}
	_, err = o.Pause(ctx, operator, all, "maintenance")
	step("pause", err)
	_, err = o.Pauses(ctx, viewer)
	step("list pauses", err)
	_, err = o.Resume(ctx, operator, all, "done")
	step("resume", err)
	_, err = o.Retry(ctx, operator, []string{byAgg["poison-a"]}, "fixed downstream")
	step("retry", err)
	_, err = o.Discard(ctx, operator, []string{byAgg["poison-b"]}, "not needed")
	step("discard", err)
	_, err = o.Release(ctx, operator, byAgg["poison-c"], "its later events may go")
	step("release", err)
	ex, err := o.NewExecutor(&ops.ExecutorConfig{Name: "console-test"})
	step("executor", err)
	rq, err := o.RequestRepair(ctx, operator, ops.RepairParams{EventID: byAgg["poison-c"], Payload: json.RawMessage(`{"n":0,"card":"fixed"}`)}, "bad card")
	step("request a repair", err)
	_, err = o.Approve(ctx, approver, rq.ID, "")
	step("approve the repair", err)
	step("carry out the repair", ex.Execute(ctx, rq.ID))
	rq, err = o.RequestReplay(ctx, operator, ops.ReplayParams{Since: time.Now().Add(-time.Hour), AggregateID: "ok-0"}, "consumer lost data")
	step("request a replay", err)
	_, err = o.Approve(ctx, approver, rq.ID, "")
	step("approve the replay", err)
	step("carry out the replay", ex.Execute(ctx, rq.ID))
	got, err := o.Request(ctx, viewer, rq.ID)
	step("read the replay", err)
	if got.State != outboxdriver.StateDone || got.Done != 2 {
		t.Fatalf("console: replay %+v; want done with the 2 events of ok-0", got)
	}
	recs, err := o.Audit(ctx, viewer, outboxdriver.AuditQuery{Limit: 100})
	step("read the audit", err)
	actions := map[string]bool{}
	for _, r := range recs {
		actions[r.Action] = true
	}
	for _, a := range []string{"pause", "resume", "retry", "discard", "release", "repair", "approve"} {
		if !actions[a] {
			t.Errorf("console: no %s in the audit: %v", a, actions)
		}
	}
	if _, err := o.PruneAudit(ctx, operator, time.Now(), "x"); err == nil || !strings.Contains(err.Error(), "only the") || !strings.Contains(err.Error(), "owner") {
		t.Errorf("the console's prune of the audit: %v; want a refusal saying only the owner prunes", err)
	}
}

// pgRefused fails unless err is PostgreSQL's permission denied (42501).
func pgRefused(t *testing.T, who, stmt string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s: %s: %v; want permission denied (SQLSTATE 42501)", who, stmt, err)
	}
}

// pgGuarded fails unless err is the audit guard's refusal.
func pgGuarded(t *testing.T, who, stmt string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "P0001" || !strings.Contains(pgErr.Message, "append-only") {
		t.Errorf("%s: %s: %v; want the audit's guard (append-only)", who, stmt, err)
	}
}

// pgTry runs stmt as pool's role, after SET LOCAL outbox.audit_prune =
// 'on' when opened, in a transaction that is rolled back.
func pgTry(ctx context.Context, pool *pgxpool.Pool, opened bool, stmt string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if opened {
		if _, err := tx.Exec(ctx, `SET LOCAL outbox.audit_prune = 'on'`); err != nil {
			return err
		}
	}
	_, err = tx.Exec(ctx, stmt)
	return err
}

// pgAuditStatements are the changes of the audit every role but the
// owner's prune is refused.
func pgAuditStatements(tb outboxdriver.Table) []string {
	a := tb.Qualified("_audit")
	return []string{`UPDATE ` + a + ` SET actor = 'mallory'`, `DELETE FROM ` + a, `TRUNCATE ` + a}
}

// pgForbidden are the statements no job role may run: DDL, the prune,
// the audit's guard switched off.
func pgForbidden(tb outboxdriver.Table) []string {
	return []string{
		`ALTER TABLE ` + tb.Qualified("") + ` ADD COLUMN x integer`,
		`CREATE INDEX ON ` + tb.Qualified("") + ` (type)`,
		`DROP TABLE ` + tb.Qualified("_dead_letter"),
		`ALTER TABLE ` + tb.Qualified("_audit") + ` DISABLE TRIGGER ALL`,
		`DROP TRIGGER ` + outboxdriver.QuoteIdent(tb.Name+"_audit_ro") + ` ON ` + tb.Qualified("_audit"),
		`SELECT ` + tb.Qualified("_audit_prune") + `(now(), 'mallory', 'operator', 'gone')`,
		`INSERT INTO ` + tb.Qualified("_masking") + ` (path, source, actor) VALUES ('x', 'operator', 'mallory')`,
		`DELETE FROM ` + tb.Qualified("_masking"),
	}
}

// pgURLAs is the test database's URL with role as the user.
func pgURLAs(t *testing.T, role string) string {
	t.Helper()
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

func TestGrantsGiveEachRoleItsJobOnPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 4*time.Minute)
	admin := testenv.Pool(t)
	tb := testenv.Table(t, admin)
	// Migrated as everyone does without separated roles: by one role (here
	// a superuser), which owns everything.
	if _, err := outboxpgx.New(admin).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	db := []string{"--db", dbURL(), "--schema", tb.Schema}
	out, err := runInProcess(t, "", append([]string{"status"}, db...)...)
	if err != nil || !strings.Contains(out, "roles                     not separated: only the owner, postgres,") {
		t.Fatalf("status of a table one role does everything on: %v\n%s", err, out)
	}
	schema := outboxdriver.QuoteIdent(tb.Schema)
	owner, ownerPool := testenv.PoolAs(t, admin, "outbox_owner")
	// Rights beyond the job, which grants takes away.
	writer, writerPool := testenv.PoolAs(t, admin, "outbox_writer", `GRANT USAGE ON SCHEMA `+schema+` TO %s`, `GRANT ALL ON `+tb.Qualified("")+`, `+tb.Qualified("_audit")+` TO %s`)
	relayRole, relayPool := testenv.PoolAs(t, admin, "outbox_relay")
	consoleRole, consolePool := testenv.PoolAs(t, admin, "outbox_console")
	out, err = runInProcess(t, "", append([]string{"status"}, db...)...)
	if err != nil || !strings.Contains(out, "  audit changeable by     "+writer+" (") {
		t.Fatalf("status of a table whose audit a role may change: %v\n%s", err, out)
	}
	args := append([]string{"grants", "--writer", writer, "--relay", relayRole, "--console", consoleRole, "--owner", owner}, db...)
	out, err = runInProcess(t, "", args...)
	if err != nil || !strings.Contains(out, "BEGIN;\n") || !strings.Contains(out, `GRANT INSERT (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext, deliver_at) ON TABLE `+tb.Qualified("")+` TO "`+writer+`";`) ||
		!strings.Contains(out, `ALTER ROLE "`+relayRole+`" REPLICATION`) {
		t.Fatalf("grants: %v\n%s", err, out)
	}
	if _, err := writerPool.Exec(ctx, `DELETE FROM `+tb.Qualified("_audit")+` WHERE false`); err != nil {
		t.Fatalf("printing the grants changed rights: %v", err)
	}
	for range 2 { // a second run changes nothing
		if out, err := runInProcess(t, "", append(args, "--apply")...); err != nil || !strings.Contains(out, "statement(s) applied") {
			t.Fatalf("grants --apply: %v\n%s", err, out)
		}
	}
	out, err = runInProcess(t, "", append([]string{"status"}, db...)...)
	want := fmt.Sprintf("roles                     separated: owner %s; rights granted to %s\n", owner, strings.Join(sortedStrings(consoleRole, relayRole, writer), ", "))
	if err != nil || !strings.Contains(out, want) || strings.Contains(out, "audit changeable") {
		t.Fatalf("status after grants: %v\n%s\nwant %q", err, out, want)
	}
	if out, err := runInProcess(t, "", "status", "--db", pgURLAs(t, consoleRole), "--schema", tb.Schema); err != nil || !strings.Contains(out, want) {
		t.Fatalf("status as the console: %v\n%s", err, out)
	}

	// The writer writes: WriteTx (one event, several, a delayed one), and
	// both log-tailing modes (insert + delete through the table's
	// function, logical decoding messages).
	flow, poison := jobEvents()
	flowIDs := ids(flow)
	ids(poison)
	w, err := outbox.New(outboxpgx.New(writerPool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, writerPool, func(tx pgx.Tx) error {
		if err := w.WriteTx(ctx, tx, flow[0]); err != nil {
			return err
		}
		return w.WriteTx(ctx, tx, append(flow[1:], poison...)...)
	})
	if err != nil {
		t.Fatalf("the writer's WriteTx: %v", err)
	}
	for _, opt := range []outboxpgx.Option{outboxpgx.WithInsertDelete(), outboxpgx.WithMessages()} {
		wm, err := outbox.New(outboxpgx.New(writerPool, opt), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
		if err != nil {
			t.Fatal(err)
		}
		// The writer may call the mode's function, which refuses the
		// write because no replication slot relays the table (not for
		// want of a right).
		err = wm.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "cdc", Type: "OrderPlaced", Payload: []byte(`{}`)})
		if !errors.Is(err, outboxpgx.ErrNoSlot) {
			t.Fatalf("the writer in a log-tailing mode, with no slot: %v, want outboxpgx.ErrNoSlot", err)
		}
	}
	table := tb.Qualified("")
	for _, stmt := range append([]string{
		`UPDATE ` + table + ` SET attempts = 0`,
		`DELETE FROM ` + table,
		`SELECT count(*) FROM ` + table,
		`TRUNCATE ` + table,
		`INSERT INTO ` + table + ` (id, aggregatetype, aggregateid, type, published_at) VALUES (gen_random_uuid(), 'a', '1', 't', now())`,
		`INSERT INTO ` + tb.Qualified("_audit") + ` (actor, action) VALUES ('w', 'login')`,
		`SELECT count(*) FROM ` + tb.Qualified("_audit"),
		`DELETE FROM ` + tb.Qualified("_dead_letter"),
		`UPDATE ` + tb.Qualified("_leases") + ` SET owner = 'me'`,
	}, pgForbidden(tb)...) {
		pgRefused(t, "writer", stmt, pgTry(ctx, writerPool, false, stmt))
	}

	// The relay drains with the relay's grants: publishes, dead-letters
	// the events the sink refuses and holds their aggregates.
	relayDrv := outboxpgx.New(relayPool)
	src, err := relayDrv.NewSource(tb, &outboxdriver.SourceConfig{Retention: outboxdriver.RetentionKeep, RelayName: "relay-1"})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, ctx, src, flowIDs, func() (int64, error) {
		var n int64
		err := admin.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("_dead_letter")).Scan(&n)
		return n, err
	})
	src.Close()
	for _, stmt := range append([]string{
		`INSERT INTO ` + table + ` (id, aggregatetype, aggregateid, type) VALUES (gen_random_uuid(), 'a', '1', 't')`,
		`UPDATE ` + table + ` SET payload = '{}'`,
		`INSERT INTO ` + tb.Qualified("_audit") + ` (actor, action) VALUES ('r', 'login')`,
		`SELECT actor FROM ` + tb.Qualified("_audit"),
		`DELETE FROM ` + tb.Qualified("_dead_letter"),
		`INSERT INTO ` + tb.Qualified("_pause") + ` (scope, actor) VALUES ('all', 'r')`,
		`SELECT * FROM ` + tb.Qualified("_requests"),
	}, pgForbidden(tb)...) {
		pgRefused(t, "relay", stmt, pgTry(ctx, relayPool, false, stmt))
	}

	// The console acts through ops with the console's grants only.
	consoleJob(t, ctx, outboxpgx.New(consolePool), tb)
	for _, stmt := range append([]string{
		`UPDATE ` + table + ` SET published_at = now()`,
		`UPDATE ` + tb.Qualified("_leases") + ` SET owner = 'me'`,
		`DELETE FROM ` + tb.Qualified("_wakeup"),
	}, pgForbidden(tb)...) {
		pgRefused(t, "console", stmt, pgTry(ctx, consolePool, false, stmt))
	}

	// Every role but the owner is refused any change of the audit, with
	// or without the setting that opened it before schema version 19.
	for _, r := range []struct {
		who  string
		pool *pgxpool.Pool
	}{{"writer", writerPool}, {"relay", relayPool}, {"console", consolePool}} {
		for _, stmt := range pgAuditStatements(tb) {
			for _, opened := range []bool{false, true} {
				pgRefused(t, fmt.Sprintf("%s (outbox.audit_prune on: %v)", r.who, opened), stmt, pgTry(ctx, r.pool, opened, stmt))
			}
		}
	}
	// The owner, and a superuser, meet the guard: only the prune deletes.
	for _, r := range []struct {
		who  string
		pool *pgxpool.Pool
	}{{"owner", ownerPool}, {"superuser", admin}} {
		for _, stmt := range pgAuditStatements(tb) {
			for _, opened := range []bool{false, true} {
				pgGuarded(t, fmt.Sprintf("%s (outbox.audit_prune on: %v)", r.who, opened), stmt, pgTry(ctx, r.pool, opened, stmt))
			}
		}
	}
	// The owner prunes, and the prune leaves its own row.
	out, err = runInProcess(t, "", "audit", "prune", "--db", pgURLAs(t, consoleRole), "--schema", tb.Schema, "--before", time.Now().UTC().Format(time.RFC3339Nano), "--actor", "mallory", "--reason", "x")
	if err == nil || !strings.Contains(err.Error(), "only the table's owner prunes the audit") {
		t.Fatalf("audit prune as the console: %v\n%s", err, out)
	}
	out, err = runInProcess(t, "", "audit", "prune", "--db", pgURLAs(t, owner), "--schema", tb.Schema, "--before", time.Now().UTC().Format(time.RFC3339Nano), "--actor", "dpo", "--reason", "kept 1 year")
	if err != nil || !strings.Contains(out, "audit row(s) older than") {
		t.Fatalf("audit prune as the owner: %v\n%s", err, out)
	}
	var n int
	var actor, action, detail string
	if err := admin.QueryRow(ctx, `SELECT count(*) OVER (), actor, action, detail FROM `+tb.Qualified("_audit")).Scan(&n, &actor, &action, &detail); err != nil {
		t.Fatal(err)
	}
	if n != 1 || actor != "dpo" || action != "audit-prune" || !strings.Contains(detail, "(database role "+owner+")") {
		t.Fatalf("after the prune: %d row(s), the last %s %s %q; want the prune's own row naming the owner's role", n, actor, action, detail)
	}
	// The owner holds the DDL: it migrates down a version and up again.
	for _, a := range [][]string{{"--down", "18"}, nil} {
		if out, err := runInProcess(t, "", append([]string{"migrate", "--db", pgURLAs(t, owner), "--schema", tb.Schema}, a...)...); err != nil {
			t.Fatalf("migrate %v as the owner: %v\n%s", a, err, out)
		}
	}
}

func sortedStrings(s ...string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// The command refuses what would not separate the jobs, each with one
// line: a role that does not exist, a superuser, one role for two jobs,
// the owner as a job role, and SQLite, which has no roles.
func TestGrantsRefusals(t *testing.T) {
	t.Parallel()
	_, db := migrated(t)
	admin := testenv.Pool(t)
	writer, _ := testenv.PoolAs(t, admin, "outbox_writer")
	owner, _ := testenv.PoolAs(t, admin, "outbox_owner")
	member, _ := testenv.PoolAs(t, admin, "outbox_member", `GRANT `+owner+` TO %s`)
	base := append([]string{"grants"}, db...)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--writer", "nobody_here"}, "--writer nobody_here: no such role"},
		{[]string{"--writer", "postgres"}, "--writer postgres: the role is a superuser"},
		{[]string{"--writer", writer, "--relay", writer}, "--writer and --relay both name " + writer},
		{[]string{"--relay", "bad-name"}, `--relay "bad-name": a role name must be`},
		{[]string{"--owner", writer}, "name at least one role"},
		{[]string{"--writer", "x@host"}, "no @host"},
		{[]string{"--console", member, "--owner", owner}, "--console " + member + ": the role is a member of the owner " + owner},
	} {
		failsWithOneLine(t, nil, c.want, append(base, c.args...)...)
	}
	path := filepath.Join(t.TempDir(), "o.db")
	if out, stderr, code := run(t, nil, "migrate", "--db", "sqlite://"+path); code != 0 {
		t.Fatalf("migrate on SQLite: %d %s %s", code, out, stderr)
	}
	failsWithOneLine(t, nil, "SQLite has no roles: whoever can write the database file can change anything", "grants", "--db", "sqlite://"+path, "--writer", "w")
	out, _, code := run(t, nil, "status", "--db", "sqlite://"+path)
	if code != 0 || !strings.Contains(out, "roles                     none: SQLite has no roles; whoever can write the database file can change anything") {
		t.Fatalf("status on SQLite: %d\n%s", code, out)
	}
}

// myRefused fails unless err is one of MySQL's errors numbered codes.
func myRefused(t *testing.T, who, stmt string, err error, codes ...uint16) {
	t.Helper()
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		for _, c := range codes {
			if my.Number == c {
				return
			}
		}
	}
	t.Errorf("%s: %s: %v; want MySQL error %v", who, stmt, err, codes)
}

// myURLAs is the test server's URL with user as the account, on database
// name.
func myURLAs(t *testing.T, user, name string) string {
	t.Helper()
	u, err := url.Parse(mysqlURL(t, name))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}

func TestGrantsGiveEachAccountItsJobOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 4*time.Minute)
	admin := mysqlDB(t, mysqlServerURL())
	name := testenv.MySQLDatabase(t, admin, "t")
	tb := outboxdriver.Table{Schema: name, Name: "outbox"}
	// The owner migrates: it is the definer of the prune procedure.
	owner, ownerDB := testenv.MySQLAs(t, admin, "outbox_owner", name, "GRANT ALL PRIVILEGES ON `"+name+"`.* TO %s")
	if out, stderr, code := run(t, nil, "migrate", "--db", myURLAs(t, owner, name)); code != 0 {
		t.Fatalf("migrate as the owner: %d %s %s", code, out, stderr)
	}
	q := func(suffix string) string { return "`" + name + "`.`outbox" + suffix + "`" }
	writer, writerDB := testenv.MySQLAs(t, admin, "outbox_writer", name, "GRANT SELECT, DELETE ON "+q("")+" TO %s")
	relayUser, relayDB := testenv.MySQLAs(t, admin, "outbox_relay", name)
	consoleUser, consoleDB := testenv.MySQLAs(t, admin, "outbox_console", name)
	db := []string{"--db", mysqlURL(t, name)}

	out, err := runInProcess(t, "", append([]string{"status"}, db...)...)
	if err != nil || !strings.Contains(out, "roles                     separated: owner "+owner+"@%; rights on the table granted to "+writer+"@%") {
		t.Fatalf("status before grants: %v\n%s", err, out)
	}
	failsWithOneLine(t, nil, "the account is the definer of the audit's prune procedure", append([]string{"grants", "--writer", owner}, db...)...)
	wide, _ := testenv.MySQLAs(t, admin, "outbox_wide", name, "GRANT SELECT, DELETE ON `"+name+"`.* TO %s")
	failsWithOneLine(t, nil, "--relay "+wide+"@%: the account holds DELETE on database "+name+", which no table grant narrows: revoke it first (REVOKE ALL PRIVILEGES ON `"+name+"`.* FROM '"+wide+"'@'%')",
		append([]string{"grants", "--relay", wide}, db...)...)
	args := append([]string{"grants", "--writer", writer, "--relay", relayUser, "--console", consoleUser}, db...)
	for range 2 {
		if out, err := runInProcess(t, "", append(args, "--apply")...); err != nil || !strings.Contains(out, "statement(s) applied") {
			t.Fatalf("grants --apply: %v\n%s", err, out)
		}
	}
	out, err = runInProcess(t, "", append([]string{"status"}, db...)...)
	if err != nil || !strings.Contains(out, "separated: owner "+owner+"@%; rights on the table granted to "+strings.Join(sortedStrings(consoleUser+"@%", relayUser+"@%", writer+"@%"), ", ")) {
		t.Fatalf("status after grants: %v\n%s", err, out)
	}
	if out, err := runInProcess(t, "", "status", "--db", myURLAs(t, consoleUser, name)); err != nil || !strings.Contains(out, "roles                     separated: rights on the table granted to "+consoleUser+"@%\n") {
		t.Fatalf("status as the console (which sees its own grants): %v\n%s", err, out)
	}

	flow, poison := jobEvents()
	flowIDs := ids(flow)
	ids(poison)
	w, err := outbox.New(outboxmysql.New(writerDB), &outbox.Config{Schema: name, Table: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := writerDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTx(ctx, tx, flow[0]); err != nil {
		t.Fatalf("the writer's WriteTx: %v", err)
	}
	if err := w.WriteTx(ctx, tx, append(flow[1:], poison...)...); err != nil {
		t.Fatalf("the writer's WriteTx: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ddl := []string{
		"ALTER TABLE " + q("") + " ADD COLUMN x INT",
		"DROP TABLE " + q("_dead_letter"),
		"DROP TRIGGER `" + name + "`.`outbox_audit_del`",
		"CALL " + q("_audit_prune") + "(UTC_TIMESTAMP(6), 'mallory', 'operator', 'gone')",
		"INSERT INTO " + q("_audit_prune") + " (id) VALUES (CONNECTION_ID())",
		"INSERT INTO " + q("_masking") + " (path, source, actor) VALUES ('x', 'operator', 'mallory')",
		"DELETE FROM " + q("_masking"),
	}
	denied := []uint16{1142, 1143, 1370} // table, column, routine command denied
	for _, stmt := range append([]string{
		"UPDATE " + q("") + " SET attempts = 0",
		"DELETE FROM " + q(""),
		"SELECT COUNT(*) FROM " + q(""),
		"INSERT INTO " + q("") + " (id, aggregatetype, aggregateid, type, published_at) VALUES (UUID(), 'a', '1', 't', UTC_TIMESTAMP(6))",
		"INSERT INTO " + q("_audit") + " (actor, action, detail) VALUES ('w', 'login', '')",
	}, ddl...) {
		_, err := writerDB.ExecContext(ctx, stmt)
		myRefused(t, "writer", stmt, err, denied...)
	}

	src, err := outboxmysql.New(relayDB).NewSource(tb, &outboxdriver.SourceConfig{Retention: outboxdriver.RetentionKeep, RelayName: "relay-1"})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, ctx, src, flowIDs, func() (int64, error) {
		var n int64
		err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+q("_dead_letter")).Scan(&n)
		return n, err
	})
	src.Close()
	for _, stmt := range append([]string{
		"INSERT INTO " + q("") + " (id, aggregatetype, aggregateid, type) VALUES (UUID(), 'a', '1', 't')",
		"INSERT INTO " + q("_audit") + " (actor, action, detail) VALUES ('r', 'login', '')",
		"INSERT INTO " + q("_pause") + " (scope, actor, reason) VALUES ('all', 'r', '')",
	}, ddl...) {
		_, err := relayDB.ExecContext(ctx, stmt)
		myRefused(t, "relay", stmt, err, denied...)
	}

	consoleJob(t, ctx, outboxmysql.New(consoleDB), tb)
	for _, stmt := range append([]string{
		"UPDATE " + q("") + " SET published_at = UTC_TIMESTAMP(6)",
		"UPDATE " + q("_leases") + " SET owner = 'me'",
	}, ddl...) {
		_, err := consoleDB.ExecContext(ctx, stmt)
		myRefused(t, "console", stmt, err, denied...)
	}

	// Every account but the owner is refused any change of the audit,
	// also while the marker table holds a row for its own connection.
	audit := []string{"UPDATE " + q("_audit") + " SET actor = 'mallory'", "DELETE FROM " + q("_audit"), "TRUNCATE " + q("_audit")}
	for _, a := range []struct {
		who string
		db  *sql.DB
	}{{"writer", writerDB}, {"relay", relayDB}, {"console", consoleDB}} {
		conn, err := a.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var id int64
		if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
			t.Fatal(err)
		}
		for _, marked := range []bool{false, true} {
			if marked {
				if _, err := ownerDB.ExecContext(ctx, "INSERT INTO "+q("_audit_prune")+" (id) VALUES (?)", id); err != nil {
					t.Fatal(err)
				}
			}
			for _, stmt := range audit {
				_, err := conn.ExecContext(ctx, stmt)
				myRefused(t, fmt.Sprintf("%s (marked: %v)", a.who, marked), stmt, err, denied...)
			}
			if marked {
				// The owner's own DELETE without the procedure meets the
				// guard: the mark is another connection's.
				_, err := ownerDB.ExecContext(ctx, "DELETE FROM "+q("_audit"))
				myRefused(t, "owner", "DELETE FROM the audit", err, 1644) // the guard's SIGNAL 45000
				if _, err := ownerDB.ExecContext(ctx, "DELETE FROM "+q("_audit_prune")); err != nil {
					t.Fatal(err)
				}
			}
		}
		conn.Close()
	}
	out, err = runInProcess(t, "", "audit", "prune", "--db", myURLAs(t, consoleUser, name), "--before", time.Now().UTC().Format(time.RFC3339Nano), "--actor", "mallory", "--reason", "x")
	if err == nil || !strings.Contains(err.Error(), "only the tables' owner") {
		t.Fatalf("audit prune as the console: %v\n%s", err, out)
	}
	out, err = runInProcess(t, "", "audit", "prune", "--db", myURLAs(t, owner, name), "--before", time.Now().UTC().Format(time.RFC3339Nano), "--actor", "dpo", "--reason", "kept 1 year")
	if err != nil || !strings.Contains(out, "audit row(s) older than") {
		t.Fatalf("audit prune as the owner: %v\n%s", err, out)
	}
	var n int
	var actor, action, detail string
	if err := admin.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM "+q("_audit")+"), actor, action, detail FROM "+q("_audit")+" ORDER BY id DESC LIMIT 1").Scan(&n, &actor, &action, &detail); err != nil {
		t.Fatal(err)
	}
	if n != 1 || actor != "dpo" || action != "audit-prune" || !strings.Contains(detail, "(database account "+owner+"@") {
		t.Fatalf("after the prune: %d row(s), the last %s %s %q; want the prune's own row naming the owner's account", n, actor, action, detail)
	}
}

// pgPoolAs is a pool on the database of dbURL that connects as role.
func pgPoolAs(t *testing.T, dbURL, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Log tailing with separated roles: with the relay's grants, the
// REPLICATION attribute and a publication the owner made (what the
// output of outbox grants says to run), a relay on the relay's role
// streams what the writer wrote, in table mode and in insert + delete
// mode, dead-letters and parks.
func TestGrantsLetTheRelayTailTheLog(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 3*time.Minute)
	admin := testenv.CDCPool(t)
	cdcURL := testenv.CDCDatabaseURL(t)
	tb := outboxdriver.Table{Schema: testenv.Name("t"), Name: "outbox"}
	drv := outboxpgx.New(admin)
	testenv.CDCTurn(t, admin, func() {
		if _, err := drv.Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: 4}); err != nil {
			t.Fatal(err)
		}
	})
	roles := testenv.Pool(t)
	owner, _ := testenv.PoolAs(t, roles, "outbox_owner", `GRANT CREATE ON DATABASE `+testenv.CDCDatabase+` TO %s`)
	writer, _ := testenv.PoolAs(t, roles, "outbox_writer")
	relayRole, _ := testenv.PoolAs(t, roles, "outbox_relay", `ALTER ROLE %s REPLICATION`)
	// Registered after the roles: runs before their cleanup, and drops
	// what they own and hold here (the slot, the publication, the tables).
	testenv.DropSlotAtEnd(t, admin, func(ctx context.Context) error {
		if _, err := drv.MigrateDown(ctx, tb, 0); err != nil {
			return err
		}
		_, err := admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+outboxdriver.QuoteIdent(tb.Schema)+` CASCADE`)
		return err
	})
	out, err := runInProcess(t, "", "grants", "--db", cdcURL, "--schema", tb.Schema, "--writer", writer, "--relay", relayRole, "--owner", owner, "--apply")
	if err != nil {
		t.Fatalf("grants --apply: %v\n%s", err, out)
	}
	ownerPool, writerPool, relayPool := pgPoolAs(t, cdcURL, owner), pgPoolAs(t, cdcURL, writer), pgPoolAs(t, cdcURL, relayRole)
	testenv.CDCTurn(t, admin, func() {
		if _, err := ownerPool.Exec(ctx, `CREATE PUBLICATION `+outboxdriver.QuoteIdent(cdc.DefaultSlot(tb))+` FOR TABLE `+tb.Qualified("")+` WITH (publish = 'insert, truncate')`); err != nil {
			t.Fatalf("the owner's publication: %v", err)
		}
	})
	src, err := cdc.NewSource(relayPool, tb, &cdc.Config{SourceConfig: outboxdriver.SourceConfig{RelayName: "relay-1", Logger: slog.New(slog.NewTextHandler(&testenv.Buffer{}, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	testenv.CDCTurn(t, admin, func() {
		if err := src.Setup(ctx); err != nil {
			t.Fatalf("set up log tailing as the relay: %v", err)
		}
	})
	flow, poison := jobEvents()
	flow = flow[:5] // not the delayed one: insert + delete mode refuses delayed events
	flowIDs := ids(flow)
	ids(poison)
	w, err := outbox.New(outboxpgx.New(writerPool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, append(flow[:3], poison...)...); err != nil {
		t.Fatalf("the writer's rows: %v", err)
	}
	wd, err := outbox.New(outboxpgx.New(writerPool, outboxpgx.WithInsertDelete()), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	if err := wd.Write(ctx, flow[3:]...); err != nil {
		t.Fatalf("the writer in insert + delete mode: %v", err)
	}
	drain(t, ctx, src, flowIDs, func() (int64, error) {
		var n int64
		err := admin.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("_dead_letter")).Scan(&n)
		return n, err
	})
}

// Time partitions with separated roles: the relay's role makes and drops
// partitions (through the maintenance function, which runs as the owner:
// the partitions it makes are the owner's), cleans up the default
// partition, and the console reads their status.
func TestGrantsLetTheRelayMaintainTimePartitions(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	admin := testenv.Pool(t)
	tb := testenv.Table(t, admin)
	if _, err := outboxpgx.New(admin).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: 4, TimePartitions: outboxdriver.TimePartitionsDay}); err != nil {
		t.Fatal(err)
	}
	owner, _ := testenv.PoolAs(t, admin, "outbox_owner")
	writer, writerPool := testenv.PoolAs(t, admin, "outbox_writer")
	relayRole, relayPool := testenv.PoolAs(t, admin, "outbox_relay")
	consoleRole, _ := testenv.PoolAs(t, admin, "outbox_console")
	if out, err := runInProcess(t, "", "grants", "--db", dbURL(), "--schema", tb.Schema, "--writer", writer, "--relay", relayRole, "--console", consoleRole, "--owner", owner, "--apply"); err != nil {
		t.Fatalf("grants --apply: %v\n%s", err, out)
	}
	// Tomorrow's partition goes missing; the relay's maintenance makes it.
	tomorrow := tb.Name + "_p" + time.Now().UTC().AddDate(0, 0, 1).Format("20060102")
	if _, err := admin.Exec(ctx, `DROP TABLE `+tb.Qualified(strings.TrimPrefix(tomorrow, tb.Name))); err != nil {
		t.Fatal(err)
	}
	out, err := runInProcess(t, "", "retention", "--db", pgURLAs(t, relayRole), "--schema", tb.Schema, "--actor", "relay")
	if err != nil || !strings.Contains(out, tomorrow) {
		t.Fatalf("retention as the relay: %v\n%s", err, out)
	}
	var by string
	if err := admin.QueryRow(ctx, `SELECT pg_get_userbyid(relowner)::text FROM pg_class WHERE oid = to_regclass($1)`, tb.Qualified(strings.TrimPrefix(tomorrow, tb.Name))).Scan(&by); err != nil || by != owner {
		t.Fatalf("the partition the relay made is owned by %q (%v); want the owner %s", by, err, owner)
	}
	w, err := outbox.New(outboxpgx.New(writerPool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	flow, poison := jobEvents()
	flowIDs := ids(flow)
	ids(poison)
	if err := w.Write(ctx, append(flow, poison...)...); err != nil {
		t.Fatalf("the writer on a table partitioned by time: %v", err)
	}
	src, err := outboxpgx.New(relayPool).NewSource(tb, &outboxdriver.SourceConfig{Retention: outboxdriver.RetentionKeep, RelayName: "relay-1"})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, ctx, src, flowIDs, func() (int64, error) {
		var n int64
		err := admin.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("_dead_letter")).Scan(&n)
		return n, err
	})
	src.Close()
	// What the relay's cleanup runs on the default partition.
	if _, err := relayPool.Exec(ctx, `DELETE FROM `+tb.Qualified("_pdefault")+` WHERE false`); err != nil {
		t.Fatalf("the relay's cleanup of the default partition: %v", err)
	}
	out, err = runInProcess(t, "", "status", "--db", pgURLAs(t, consoleRole), "--schema", tb.Schema)
	if err != nil || !strings.Contains(out, "time partitions ") || !strings.Contains(out, "backlog                   3\n") {
		t.Fatalf("status as the console: %v\n%s", err, out)
	}
}

// A default partition the maintenance makes again (it was dropped) gets
// the rights `outbox grants` gave the one before: the relay cleans it up
// directly and the console reads it, with no new run of `outbox grants`,
// and a new run changes nothing there. The writer gets nothing.
func TestGrantsFollowARecreatedDefaultPartition(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	admin := testenv.Pool(t)
	tb := testenv.Table(t, admin)
	if _, err := outboxpgx.New(admin).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: 4, TimePartitions: outboxdriver.TimePartitionsDay}); err != nil {
		t.Fatal(err)
	}
	owner, _ := testenv.PoolAs(t, admin, "outbox_owner")
	writer, _ := testenv.PoolAs(t, admin, "outbox_writer")
	relayRole, relayPool := testenv.PoolAs(t, admin, "outbox_relay")
	consoleRole, consolePool := testenv.PoolAs(t, admin, "outbox_console")
	grants := func() {
		t.Helper()
		if out, err := runInProcess(t, "", "grants", "--db", dbURL(), "--schema", tb.Schema, "--writer", writer, "--relay", relayRole, "--console", consoleRole, "--owner", owner, "--apply"); err != nil {
			t.Fatalf("grants --apply: %v\n%s", err, out)
		}
	}
	def := tb.Qualified("_pdefault")
	acl := func() string {
		t.Helper()
		var s string
		if err := admin.QueryRow(ctx, `SELECT coalesce(string_agg(pg_get_userbyid(a.grantee) || ':' || a.privilege_type, ',' ORDER BY 1), '')
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a WHERE c.oid = to_regclass($1) AND a.grantee <> c.relowner`, def).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	grants()
	given := acl()
	if !strings.Contains(given, relayRole+":DELETE") || !strings.Contains(given, consoleRole+":SELECT") {
		t.Fatalf("after outbox grants the default partition's rights are %q", given)
	}

	// Dropped (it was empty), made again by the relay's maintenance.
	if _, err := admin.Exec(ctx, `DROP TABLE `+def); err != nil {
		t.Fatal(err)
	}
	out, err := runInProcess(t, "", "retention", "--db", pgURLAs(t, relayRole), "--schema", tb.Schema, "--actor", "relay")
	if err != nil || !strings.Contains(out, tb.Name+"_pdefault") {
		t.Fatalf("retention as the relay: %v\n%s", err, out)
	}
	if got := acl(); got != given {
		t.Fatalf("the default partition made again has the rights %q; want those outbox grants gave, %q", got, given)
	}
	if strings.Contains(given, writer+":") {
		t.Fatalf("the writer holds rights on the default partition: %q", given)
	}
	if _, err := relayPool.Exec(ctx, `DELETE FROM `+def+` WHERE published_at IS NOT NULL`); err != nil {
		t.Fatalf("the relay's cleanup of the default partition made again: %v", err)
	}
	var n int
	if err := consolePool.QueryRow(ctx, `SELECT count(*) FROM `+def).Scan(&n); err != nil {
		t.Fatalf("the console's read of the default partition made again: %v", err)
	}
	grants()
	if got := acl(); got != given {
		t.Fatalf("outbox grants run again changed the default partition's rights to %q from %q", got, given)
	}
}

// mariaDBRole creates a MariaDB role named from prefix, dropped when the
// test ends, with grants (%s is the role).
func mariaDBRole(t *testing.T, admin *sql.DB, prefix string, grants ...string) string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	role := testenv.Name(prefix)
	if _, err := admin.ExecContext(ctx, "CREATE ROLE "+role); err != nil {
		t.Fatalf("create role %s (MariaDB): %v", role, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})
	for _, g := range grants {
		if _, err := admin.ExecContext(ctx, strings.ReplaceAll(g, "%s", role)); err != nil {
			t.Fatalf("%s: %v", g, err)
		}
	}
	return role
}

// MariaDB roles as the jobs: `outbox grants` gives each role its job,
// and accounts that hold the role as their default role do the job and
// nothing more. A role that holds, through another role, rights on the
// whole database is refused, as such an account is.
func TestGrantsGiveMariaDBRolesTheirJobs(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 4*time.Minute)
	admin := mysqlDB(t, mysqlServerURL())
	var version string
	if err := admin.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") {
		t.Fatalf("the test server is %s; this test needs MariaDB (bash .ci/test --setup-only starts it)", version)
	}
	name := testenv.MySQLDatabase(t, admin, "t")
	tb := outboxdriver.Table{Schema: name, Name: "outbox"}
	db := []string{"--db", mysqlURL(t, name)}
	if out, stderr, code := run(t, nil, append([]string{"migrate"}, db...)...); code != 0 {
		t.Fatalf("migrate: %d %s %s", code, out, stderr)
	}
	q := func(suffix string) string { return "`" + name + "`.`outbox" + suffix + "`" }
	writerRole := mariaDBRole(t, admin, "outbox_wrole")
	relayRole := mariaDBRole(t, admin, "outbox_rrole")
	consoleRole := mariaDBRole(t, admin, "outbox_crole")
	as := func(prefix, role string) *sql.DB {
		_, conn := testenv.MySQLAs(t, admin, prefix, name, "GRANT "+role+" TO %s", "SET DEFAULT ROLE "+role+" FOR %s")
		return conn
	}
	writerDB, relayDB, consoleDB := as("outbox_wuser", writerRole), as("outbox_ruser", relayRole), as("outbox_cuser", consoleRole)

	// A role with DELETE on the whole database through another role.
	wide := mariaDBRole(t, admin, "outbox_wide", "GRANT SELECT, DELETE ON `"+name+"`.* TO %s")
	nested := mariaDBRole(t, admin, "outbox_nested", "GRANT "+wide+" TO %s")
	failsWithOneLine(t, nil, "--relay "+nested+": the role holds DELETE on database "+name+" through the role "+wide+", which no table grant narrows",
		append([]string{"grants", "--relay", nested}, db...)...)

	args := append([]string{"grants", "--writer", writerRole, "--relay", relayRole, "--console", consoleRole}, db...)
	out, err := runInProcess(t, "", args...)
	if err != nil || !strings.Contains(out, "GRANT SELECT ON "+q("_masking")+" TO '"+consoleRole+"'") || !strings.Contains(out, "role "+relayRole) {
		t.Fatalf("grants to roles: %v\n%s", err, out)
	}
	if out, err := runInProcess(t, "", append(args, "--apply")...); err != nil || !strings.Contains(out, "statement(s) applied") {
		t.Fatalf("grants --apply: %v\n%s", err, out)
	}

	flow, poison := jobEvents()
	flowIDs := ids(flow)
	ids(poison)
	w, err := outbox.New(outboxmysql.New(writerDB), &outbox.Config{Schema: name, Table: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, append(flow, poison...)...); err != nil {
		t.Fatalf("the writer through its role: %v", err)
	}
	src, err := outboxmysql.New(relayDB).NewSource(tb, &outboxdriver.SourceConfig{Retention: outboxdriver.RetentionKeep, RelayName: "relay-1"})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, ctx, src, flowIDs, func() (int64, error) {
		var n int64
		err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+q("_dead_letter")).Scan(&n)
		return n, err
	})
	src.Close()
	consoleJob(t, ctx, outboxmysql.New(consoleDB), tb)

	denied := []uint16{1142, 1143, 1370}
	for _, c := range []struct {
		who  string
		conn *sql.DB
		stmt string
	}{
		{"writer", writerDB, "SELECT COUNT(*) FROM " + q("")},
		{"writer", writerDB, "DELETE FROM " + q("")},
		{"relay", relayDB, "INSERT INTO " + q("_pause") + " (scope, actor, reason) VALUES ('all', 'r', '')"},
		{"relay", relayDB, "DELETE FROM " + q("_masking")},
		{"console", consoleDB, "UPDATE " + q("_leases") + " SET owner = 'me'"},
		{"console", consoleDB, "INSERT INTO " + q("_masking") + " (path, source, actor) VALUES ('x', 'operator', 'mallory')"},
		{"console", consoleDB, "DELETE FROM " + q("_audit")},
		{"console", consoleDB, "DROP TABLE " + q("_dead_letter")},
	} {
		_, err := c.conn.ExecContext(ctx, c.stmt)
		myRefused(t, c.who+" through its role", c.stmt, err, denied...)
	}
}
