package outboxdrivertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// storeCalls are the Store's calls that read or change an outbox table's
// tables, each with arguments it accepts; each returns its error.
func storeCalls(st outboxdriver.Store, e *env) []struct {
	name string
	call func() error
} {
	ctx, tb := e.ctx, e.table
	by := outboxdriver.Acting{Name: "drivertest", Role: "operator", Reason: "conformance"}
	const id = "00000000-0000-4000-8000-000000000001"
	q := outboxdriver.DeadLetterQuery{Limit: 10}
	f := outboxdriver.ReplayFilter{Since: time.Unix(0, 0)}
	type call = struct {
		name string
		call func() error
	}
	return []call{
		{"Status", func() error { _, err := st.Status(ctx, tb); return err }},
		{"EstimateStatus", func() error { _, err := st.EstimateStatus(ctx, tb, 100); return err }},
		{"BacklogBy", func() error { _, err := st.BacklogBy(ctx, tb, "type", 10); return err }},
		{"Backlog", func() error { _, err := st.Backlog(ctx, tb, 10); return err }},
		{"Relays", func() error { _, err := st.Relays(ctx, tb); return err }},
		{"RecordSample", func() error { return st.RecordSample(ctx, tb, time.Hour) }},
		{"Samples", func() error { _, err := st.Samples(ctx, tb, time.Unix(0, 0)); return err }},
		{"FindDeadLetters", func() error { _, err := st.FindDeadLetters(ctx, tb, q); return err }},
		{"DeadLetterValues", func() error { _, err := st.DeadLetterValues(ctx, tb, q, "type", 10); return err }},
		{"FindRoutedDeadLetters", func() error { _, err := st.FindRoutedDeadLetters(ctx, tb, q, "type", []string{"t"}); return err }},
		{"DeadLetter", func() error { _, err := st.DeadLetter(ctx, tb, id); return err }},
		{"RetryDeadLetters", func() error { _, err := st.RetryDeadLetters(ctx, tb, nil, by); return err }},
		{"DiscardDeadLetters", func() error { _, err := st.DiscardDeadLetters(ctx, tb, []string{id}, by); return err }},
		{"FailureGroups", func() error { _, err := st.FailureGroups(ctx, tb, 10); return err }},
		{"FailureGroupIDs", func() error { _, err := st.FailureGroupIDs(ctx, tb, "k", 10); return err }},
		{"ListPauses", func() error { _, err := st.ListPauses(ctx, tb); return err }},
		{"SetPause", func() error {
			_, err := st.SetPause(ctx, tb, outboxdriver.PauseScope{Kind: outboxdriver.PauseAll}, by)
			return err
		}},
		{"LiftPause", func() error {
			_, err := st.LiftPause(ctx, tb, outboxdriver.PauseScope{Kind: outboxdriver.PauseAll}, by)
			return err
		}},
		{"HeldAggregates", func() error { _, err := st.HeldAggregates(ctx, tb, 10); return err }},
		{"MaskPaths", func() error { _, err := st.MaskPaths(ctx, tb); return err }},
		{"AddMaskPath", func() error {
			_, err := st.AddMaskPath(ctx, tb, outboxdriver.MaskPath{Path: "card.number", Source: outboxdriver.MaskSourceOperator}, by)
			return err
		}},
		{"RemoveMaskPath", func() error {
			_, err := st.RemoveMaskPath(ctx, tb, outboxdriver.MaskPath{Path: "card.number"}, by)
			return err
		}},
		{"ReleaseHeld", func() error { _, err := st.ReleaseHeld(ctx, tb, id, by); return err }},
		{"AppendAudit", func() error {
			return st.AppendAudit(ctx, tb, outboxdriver.AuditRecord{Actor: "drivertest", Action: "login", Role: "viewer"})
		}},
		{"FindAudit", func() error { _, err := st.FindAudit(ctx, tb, outboxdriver.AuditQuery{Limit: 10}); return err }},
		{"PruneAudit", func() error { _, err := st.PruneAudit(ctx, tb, time.Unix(0, 0), by); return err }},
		{"CreateRequest", func() error {
			return st.CreateRequest(ctx, tb, outboxdriver.Request{ID: id, Kind: outboxdriver.RequestReplay, Requester: "drivertest",
				RequesterRole: "operator", Reason: "conformance", Params: json.RawMessage(`{}`), ExpiresAt: time.Now().Add(time.Hour)}, by)
		}},
		{"GetRequest", func() error { _, err := st.GetRequest(ctx, tb, id); return err }},
		{"ListRequests", func() error { _, err := st.ListRequests(ctx, tb, "", 10); return err }},
		{"DecideRequest", func() error { _, err := st.DecideRequest(ctx, tb, id, outboxdriver.StateApproved, by); return err }},
		{"ExpireRequests", func() error { _, err := st.ExpireRequests(ctx, tb, by); return err }},
		{"ClaimRequest", func() error { _, err := st.ClaimRequest(ctx, tb, id, "drivertest", time.Minute); return err }},
		{"SetRequestTotal", func() error { return st.SetRequestTotal(ctx, tb, id, 1) }},
		{"FinishRequest", func() error { return st.FinishRequest(ctx, tb, id, "drivertest", 1, outboxdriver.StateDone, "") }},
		{"HasPublished", func() error { _, err := st.HasPublished(ctx, tb); return err }},
		{"PreviewReplay", func() error { _, _, err := st.PreviewReplay(ctx, tb, f, 10); return err }},
		{"RoutedValues", func() error { _, err := st.RoutedValues(ctx, tb, f, "type", 10); return err }},
		{"ReplayBatch", func() error {
			_, _, err := st.ReplayBatch(ctx, tb, outboxdriver.ReplayBatch{Request: id, Executor: "drivertest", Epoch: 1, Filter: f, Limit: 10})
			return err
		}},
		{"RepairDeadLetter", func() error {
			return st.RepairDeadLetter(ctx, tb, id, "drivertest", 1, id, json.RawMessage(`{}`), nil, by)
		}},
	}
}

// testNotMigrated: on a table never migrated, every call of the Store
// wraps ErrNotMigrated and says so in one message, the same for every
// call; on a table at an older schema version, a call that needs a newer
// one says which version the table is at and to migrate it.
func (s *suite) testNotMigrated(t *testing.T) {
	st := s.h.Store
	e := &env{t: t, s: s, table: s.h.NewTable(t), ctx: testContext(t)}
	var first string
	for _, c := range storeCalls(st, e) {
		err := c.call()
		switch {
		case !errors.Is(err, outboxdriver.ErrNotMigrated):
			t.Errorf("%s on a table never migrated = %v; want an error wrapping ErrNotMigrated", c.name, err)
		case first == "":
			first = err.Error()
		case err.Error() != first:
			t.Errorf("%s on a table never migrated says %q; want what Status says, %q", c.name, err, first)
		}
	}
	if want := fmt.Sprintf("%s: %s", e.table, outboxdriver.ErrNotMigrated); first != "" && !strings.HasSuffix(first, want) {
		t.Errorf("a table never migrated: %q; want it to end with %q", first, want)
	}

	// Version 1 predates the console's tables on every driver.
	if _, err := st.Migrate(e.ctx, e.table, &outboxdriver.MigrateOptions{Partitions: partitions}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	s.dropAtEnd(t, e.table)
	if _, err := st.MigrateDown(e.ctx, e.table, 1); err != nil {
		t.Fatalf("MigrateDown to 1: %v", err)
	}
	// What predates the masking table masks nothing stored.
	if ps, err := st.MaskPaths(e.ctx, e.table); err != nil || len(ps) != 0 {
		t.Errorf("MaskPaths on a table at schema version 1 = %v, %v; want none and no error", ps, err)
	}
	want := fmt.Sprintf("the table is at schema version 1 of %d: run `outbox migrate` first", st.LatestVersion())
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"SetPause", func() error {
			_, err := st.SetPause(e.ctx, e.table, outboxdriver.PauseScope{Kind: outboxdriver.PauseAll}, outboxdriver.Acting{Name: "drivertest"})
			return err
		}},
		{"FindAudit", func() error { _, err := st.FindAudit(e.ctx, e.table, outboxdriver.AuditQuery{Limit: 10}); return err }},
		{"AddMaskPath", func() error {
			_, err := st.AddMaskPath(e.ctx, e.table, outboxdriver.MaskPath{Path: "card.number", Source: outboxdriver.MaskSourceOperator}, outboxdriver.Acting{Name: "drivertest"})
			return err
		}},
	} {
		err := c.call()
		switch {
		case err == nil:
			t.Errorf("%s on a table at schema version 1 succeeded; want an error saying to migrate", c.name)
		case errors.Is(err, outboxdriver.ErrNotMigrated):
			t.Errorf("%s on a table at schema version 1 = %v; want no ErrNotMigrated (the table exists)", c.name, err)
		case !strings.HasSuffix(err.Error(), want):
			t.Errorf("%s on a table at schema version 1 = %q; want it to end with %q", c.name, err, want)
		}
	}
}
