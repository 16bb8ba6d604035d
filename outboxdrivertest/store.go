package outboxdrivertest

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// testMigrate: Migrate is idempotent, MigrateDown(0) removes the table,
// Status of a table that does not exist wraps ErrNotMigrated, and
// concurrent migrators apply every version exactly once.
func (s *suite) testMigrate(t *testing.T) {
	st := s.h.Store
	ctx := testContext(t)
	tb := s.h.NewTable(t)
	if _, err := st.Status(ctx, tb); !errors.Is(err, outboxdriver.ErrNotMigrated) {
		t.Fatalf("Status of a table never migrated = %v; want an error wrapping ErrNotMigrated", err)
	}
	latest := st.LatestVersion()
	if latest < 1 {
		t.Fatalf("LatestVersion = %d, want at least 1", latest)
	}
	first, err := st.Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: partitions})
	if err != nil {
		t.Fatalf("first Migrate: %v", err)
	}
	s.dropAtEnd(t, tb)
	if len(first) == 0 || first[len(first)-1] != latest {
		t.Fatalf("first Migrate applied %v; want every version up to %d", first, latest)
	}
	second, err := st.Migrate(ctx, tb, nil)
	if err != nil || len(second) != 0 {
		t.Fatalf("second Migrate applied %v (err %v); want nothing", second, err)
	}
	status, err := st.Status(ctx, tb)
	if err != nil {
		t.Fatalf("Status after Migrate: %v", err)
	}
	if status.SchemaVersion != latest || status.LatestSchemaVersion != latest {
		t.Fatalf("Status schema version %d, latest %d; want both %d", status.SchemaVersion, status.LatestSchemaVersion, latest)
	}
	e := &env{t: t, s: s, table: tb, ctx: ctx}
	e.write(ev("gone", 0))
	down, err := st.MigrateDown(ctx, tb, 0)
	if err != nil {
		t.Fatalf("MigrateDown to 0: %v", err)
	}
	if !sameSet(down, first) {
		t.Fatalf("MigrateDown to 0 reverted %v; want the versions applied, %v", down, first)
	}
	if _, err := st.Status(ctx, tb); !errors.Is(err, outboxdriver.ErrNotMigrated) {
		t.Fatalf("Status after MigrateDown to 0 = %v; want an error wrapping ErrNotMigrated", err)
	}
	again, err := st.Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: partitions})
	if err != nil || !sameSet(again, first) {
		t.Fatalf("Migrate after MigrateDown applied %v (err %v); want %v", again, err, first)
	}
	if status := e.status(); status.Backlog != 0 {
		t.Fatalf("backlog %d in a table migrated anew; MigrateDown to 0 must drop the events", status.Backlog)
	}

	// Several migrators at once (processes starting together): every
	// version is applied exactly once, and none fails.
	other := s.h.NewTable(t)
	const migrators = 3
	applied := make([][]int, migrators)
	errs := make([]error, migrators)
	var wg sync.WaitGroup
	for i := range migrators {
		wg.Go(func() {
			applied[i], errs[i] = st.Migrate(ctx, other, &outboxdriver.MigrateOptions{Partitions: partitions})
		})
	}
	wg.Wait()
	s.dropAtEnd(t, other)
	var all []int
	for i := range migrators {
		if errs[i] != nil {
			t.Fatalf("concurrent Migrate %d: %v", i, errs[i])
		}
		all = append(all, applied[i]...)
	}
	if !sameSet(all, first) {
		t.Fatalf("concurrent migrators applied %v in all; want each of %v once", all, first)
	}
}

// testHostileNames: table and schema names that are not plain identifiers
// are refused by every Store method with a one-line error, and nothing is
// touched.
func (s *suite) testHostileNames(t *testing.T) {
	e := s.newEnv(t, partitions)
	e.write(ev("a", 0))
	name, schema := e.table.Name, e.table.Schema
	hostile := []outboxdriver.Table{
		{Schema: schema, Name: name + `"; DROP TABLE ` + name + `; --`},
		{Schema: schema, Name: name + "`; DROP TABLE " + name + "; --"},
		{Schema: schema, Name: name + `'; DELETE FROM ` + name + `; --`},
		{Schema: schema, Name: "a b"},
		{Schema: schema, Name: name + "\x00"},
		{Schema: schema + `"; DROP SCHEMA ` + schema + ` CASCADE; --`, Name: name},
		{Schema: schema, Name: strings.Repeat("x", 200)},
	}
	st := s.h.Store
	for _, tb := range hostile {
		check := func(what string, err error) {
			t.Helper()
			switch {
			case err == nil:
				t.Errorf("%s accepted the table %q.%q", what, tb.Schema, tb.Name)
			case errors.Is(err, outboxdriver.ErrNotMigrated):
				t.Errorf("%s looked the table %q.%q up (%v); want it refused as a name", what, tb.Schema, tb.Name, err)
			case strings.Contains(err.Error(), "\n"):
				t.Errorf("%s refused %q.%q with a multi-line error %q; want one line", what, tb.Schema, tb.Name, err)
			}
		}
		_, err := st.Migrate(e.ctx, tb, nil)
		check("Migrate", err)
		_, err = st.MigrateDown(e.ctx, tb, 0)
		check("MigrateDown", err)
		_, err = st.Status(e.ctx, tb)
		check("Status", err)
		_, err = st.FindDeadLetters(e.ctx, tb, outboxdriver.DeadLetterQuery{Limit: 10})
		check("FindDeadLetters", err)
		_, err = st.RetryDeadLetters(e.ctx, tb, nil, outboxdriver.Acting{Name: "drivertest"})
		check("RetryDeadLetters", err)
		_, err = st.DiscardDeadLetters(e.ctx, tb, nil, outboxdriver.Acting{Name: "drivertest"})
		check("DiscardDeadLetters", err)
		_, err = st.FindAudit(e.ctx, tb, outboxdriver.AuditQuery{Limit: 10})
		check("FindAudit", err)
		src, err := st.NewSource(tb, nil)
		check("NewSource", err)
		if err == nil {
			src.Close()
		}
	}
	// Nothing was touched: the real table still holds its event.
	if status := e.status(); status.Backlog != 1 {
		t.Fatalf("backlog %d after the hostile calls, want the 1 event written before", status.Backlog)
	}
	src := e.source(outboxdriver.SourceConfig{})
	if got := e.claim(src, e.leaseAll(src), 10); len(got) != 1 {
		t.Fatalf("claimed %v after the hostile calls, want the 1 event written before", describe(got))
	}
}

// testStatus: backlog, the age of the oldest unpublished event, dead
// letters, held aggregates and every partition's lease.
func (s *suite) testStatus(t *testing.T) {
	e := s.newEnv(t, partitions)
	st := e.status()
	if st.Table.Name != e.table.Name {
		t.Errorf("Status.Table = %v, want %v", st.Table, e.table)
	}
	if st.Backlog != 0 || st.OldestUnpublishedAge != 0 || st.DeadLetters != 0 || st.Published != 0 || st.Held != 0 || st.OldestHeldAge != 0 {
		t.Fatalf("status of an empty table = %+v; want zero counts and ages", st)
	}
	if len(st.Partitions) != partitions {
		t.Fatalf("status lists %d partitions, want the %d migrated", len(st.Partitions), partitions)
	}
	for i, p := range st.Partitions {
		if p.Partition != i || p.Owner != "" || p.Backlog != 0 {
			t.Fatalf("partition %d of a table never relayed = %+v; want partition %d, no owner, no backlog", i, p, i)
		}
	}
	e.write(ev("a", 0), ev("a", 1), ev("b", 0))
	await.Eventually(t, 10*time.Second, func() error {
		if st = e.status(); st.OldestUnpublishedAge <= 0 {
			return fmt.Errorf("oldest unpublished age still %s with a backlog of %d", st.OldestUnpublishedAge, st.Backlog)
		}
		return nil
	})
	if st.Backlog != 3 {
		t.Fatalf("backlog %d, want 3", st.Backlog)
	}
	if st.OldestUnpublishedAge > time.Hour {
		t.Fatalf("oldest unpublished age %s for events written a moment ago", st.OldestUnpublishedAge)
	}
	var sum int64
	for _, p := range st.Partitions {
		sum += p.Backlog
	}
	if sum != 3 {
		t.Fatalf("the partitions' backlogs add up to %d, want 3: %+v", sum, st.Partitions)
	}

	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)
	st = e.status()
	held := epochs(leases)
	for _, p := range st.Partitions {
		if p.Owner != src.RelayName() || p.ExpiresIn <= 0 || p.Epoch != held[p.Partition] {
			t.Fatalf("partition %+v; want owner %q, epoch %d, a lease still running", p, src.RelayName(), held[p.Partition])
		}
	}
	b := e.open(src, leases, 10)
	recs := b.Records()
	if len(recs) != 3 {
		t.Fatalf("claimed %v, want the 3 written", describe(recs))
	}
	e.finish(b, outboxdriver.Outcome{
		Published: []string{recs[2].ID},
		Failed:    []outboxdriver.Failure{{ID: recs[0].ID, Err: errors.New("poison"), DeadLetter: true, Hold: true}},
	})
	st = e.status()
	if st.Backlog != 1 || st.DeadLetters != 1 || st.Held != 1 || st.Published != 0 {
		t.Fatalf("after one publish and one held dead letter: %+v; want backlog 1, 1 dead letter, 1 held, 0 published", st)
	}
	await.Eventually(t, 10*time.Second, func() error {
		if age := e.status().OldestHeldAge; age <= 0 {
			return fmt.Errorf("the held aggregate's age stays %s", age)
		}
		return nil
	})
	if err := src.Release(e.ctx, leases, true); err != nil {
		t.Fatalf("release: %v", err)
	}
	for _, p := range e.status().Partitions {
		if p.Owner != "" {
			t.Fatalf("partition %+v still owned after Release", p)
		}
	}
}

// testBacklogBy: the backlog grouped by a routed column, the largest
// groups first and the rest in one more group; by created_at in RFC 3339;
// an unknown column refused. EstimateStatus counts as Status does below
// its bound, and time partition maintenance does nothing on a table that
// is not partitioned by time.
func (s *suite) testBacklogBy(t *testing.T) {
	e := s.newEnv(t, partitions)
	st := s.h.Store
	e.write(ev("a", 0), ev("a", 1), ev("a", 2), ev("b", 0), ev("b", 1), ev("c", 0))
	groups, err := st.BacklogBy(e.ctx, e.table, "aggregateid", 2)
	if err != nil {
		t.Fatalf("BacklogBy: %v", err)
	}
	type group struct {
		value  string
		rest   bool
		events int64
	}
	var got []group
	for _, g := range groups {
		got = append(got, group{g.Value, g.Rest, g.Events})
		if g.OldestAge < 0 || g.OldestAge > time.Hour {
			t.Fatalf("group %+v: oldest age %s for events written a moment ago", g, g.OldestAge)
		}
	}
	if want := []group{{"a", false, 3}, {"b", false, 2}, {"", true, 1}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("BacklogBy(aggregateid, 2) = %+v; want %+v", got, want)
	}
	groups, err = st.BacklogBy(e.ctx, e.table, "aggregateid", 10)
	if err != nil || len(groups) != 3 || groups[2].Value != "c" || groups[2].Rest {
		t.Fatalf("BacklogBy(aggregateid, 10) = %+v, %v; want a, b and c, no rest", groups, err)
	}
	groups, err = st.BacklogBy(e.ctx, e.table, "created_at", 100)
	if err != nil || len(groups) == 0 {
		t.Fatalf("BacklogBy(created_at) = %+v, %v", groups, err)
	}
	var sum int64
	for _, g := range groups {
		at, perr := time.Parse(time.RFC3339Nano, g.Value)
		if perr != nil || g.Rest || !strings.HasSuffix(g.Value, "Z") || time.Since(at) > time.Hour || time.Until(at) > time.Hour {
			t.Fatalf("a created_at group %+v: want a time of the last hour in RFC 3339, UTC", g)
		}
		sum += g.Events
	}
	if sum != 6 {
		t.Fatalf("the created_at groups hold %d events, want 6", sum)
	}
	if _, err := st.BacklogBy(e.ctx, e.table, "payload", 10); err == nil {
		t.Fatal("BacklogBy(payload) was not refused")
	}
	est, err := st.EstimateStatus(e.ctx, e.table, 1000)
	if err != nil || est.Backlog != 6 || est.Estimated.Backlog {
		t.Fatalf("EstimateStatus = backlog %d (estimated %v), %v; want exactly 6", est.Backlog, est.Estimated.Backlog, err)
	}
	if changes, err := st.MaintainTimePartitions(e.ctx, e.table, outboxdriver.TimePartitionMaintenance{KeepFor: time.Hour}); err != nil || len(changes) != 0 {
		t.Fatalf("Store.MaintainTimePartitions of a table without time partitions = %+v, %v; want nothing", changes, err)
	}
	src := e.source(outboxdriver.SourceConfig{})
	if changes, err := src.MaintainTimePartitions(e.ctx, outboxdriver.TimePartitionMaintenance{KeepFor: time.Hour}); err != nil || len(changes) != 0 {
		t.Fatalf("Source.MaintainTimePartitions of a table without time partitions = %+v, %v; want nothing", changes, err)
	}
}
