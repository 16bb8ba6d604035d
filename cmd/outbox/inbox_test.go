package main

// `outbox inbox status` and `outbox inbox dlq` on every database the inbox
// supports: the figures, the masking, retry and discard with their audit
// rows, and bad input.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

func TestInboxDLQCommands(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		target func(*testing.T) inboxTarget
	}{
		{"postgres", inboxOnPostgres},
		{"sqlite", inboxOnSQLite},
		{"mysql", inboxOnMySQL},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			it := c.target(t)
			cli := func(args ...string) string {
				t.Helper()
				out, stderr, code := run(t, []string{"OUTBOX_DB="}, append(args, it.flags...)...)
				if code != 0 {
					t.Fatalf("%v: exit %d: %s", args, code, stderr)
				}
				return out
			}
			cli("migrate") // the audit table
			cli("migrate", "--inbox")

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			drv, err := inboxsql.New(it.db, it.dialect)
			if err != nil {
				t.Fatal(err)
			}
			ib, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Schema: it.schema})
			if err != nil {
				t.Fatal(err)
			}
			other, err := inbox.New(drv, &inbox.Config{Consumer: "shipping", Schema: it.schema})
			if err != nil {
				t.Fatal(err)
			}
			event := uuid.NewString()
			if _, err := ib.Handle(ctx, inbox.Message{EventID: uuid.NewString()}, func(context.Context, *sql.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			for _, m := range []struct {
				ib  *inbox.Inbox[*sql.Tx]
				msg inbox.Message
			}{
				{ib, inbox.Message{EventID: event, AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
					Headers: map[string]string{"id": event}, Payload: []byte(`{"customer":{"email":"ann@example.com"},"total":12}`)}},
				{ib, inbox.Message{EventID: "not-a-uuid", Payload: []byte("\x00\xffbinary")}},
				{other, inbox.Message{EventID: uuid.NewString()}},
			} {
				if err := m.ib.DeadLetter(ctx, m.msg, errors.New("customer\nunknown")); err != nil {
					t.Fatal(err)
				}
			}
			dls, err := ib.DeadLetters(ctx, 10)
			if err != nil || len(dls) != 2 {
				t.Fatalf("dead letters %v, %v", dls, err)
			}
			first, second := dls[0].ID, dls[1].ID

			out := cli("inbox", "status", "--consumer", "billing")
			for _, want := range []string{"processed:             1 ", "dead letters:          2 (0 marked for retry)", "oldest dead letter:    20"} {
				if !strings.Contains(out, want) {
					t.Fatalf("status lacks %q:\n%s", want, out)
				}
			}
			var listed []inbox.DeadLetter
			if err := json.Unmarshal([]byte(cli("inbox", "dlq", "list", "--consumer", "billing", "--json")), &listed); err != nil {
				t.Fatal(err)
			}
			if len(listed) != 2 || listed[0].ID != first || listed[0].EventID != event || listed[0].Payload != nil {
				t.Fatalf("list --json: %+v; want billing's two dead letters, oldest first, without payloads", listed)
			}
			if out := cli("inbox", "dlq", "list", "--consumer", "billing"); !strings.Contains(out, "customer unknown") || strings.Count(out, "\n") != 3 {
				t.Fatalf("list: the error on one line, one line per dead letter:\n%s", out)
			}
			out = cli("inbox", "dlq", "show", fmt.Sprint(first), "--consumer", "billing", "--sensitive-path", "customer.email")
			if strings.Contains(out, "ann@example.com") || !strings.Contains(out, `"email": "***"`) || !strings.Contains(out, "header id: "+event) {
				t.Fatalf("show with a sensitive path: the email must be masked, the headers shown:\n%s", out)
			}

			// Retry one: marked, and a running consumer would claim it.
			out = cli("inbox", "dlq", "retry", fmt.Sprint(first), "--consumer", "billing", "--actor", "alice", "--reason", "customer imported")
			if !strings.Contains(out, "1 dead letter(s) of billing marked for retry") {
				t.Fatalf("retry: %q", out)
			}
			if out := cli("inbox", "status", "--consumer", "billing"); !strings.Contains(out, "(1 marked for retry)") {
				t.Fatalf("status after retry:\n%s", out)
			}
			claimed, err := ib.ClaimRetries(ctx, 10)
			if err != nil || len(claimed) != 1 || claimed[0].ID != first {
				t.Fatalf("ClaimRetries after retry = %+v, %v; want dead letter %d", claimed, err, first)
			}
			// Discard all of billing's: shipping's stays.
			out = cli("inbox", "dlq", "discard", "--all", "--consumer", "billing", "--actor", "bob")
			if !strings.Contains(out, "2 dead letter(s) of billing discarded") {
				t.Fatalf("discard --all: %q", out)
			}
			if dls, err := other.DeadLetters(ctx, 10); err != nil || len(dls) != 1 {
				t.Fatalf("shipping's dead letters after billing's discard: %v, %v", dls, err)
			}
			if out := cli("inbox", "status", "--consumer", "billing", "--json"); !strings.Contains(out, `"dead_letters":0`) || strings.Contains(out, "oldest_dead_letter") {
				t.Fatalf("status --json after discard: %s", out)
			}

			// Every action is in the outbox's audit, who, why and which event.
			var recs []outboxdriver.AuditRecord
			for _, line := range strings.Split(strings.TrimSpace(cli("dlq", "audit")), "\n") {
				var r outboxdriver.AuditRecord
				if err := json.Unmarshal([]byte(line), &r); err != nil {
					t.Fatalf("audit line %q: %v", line, err)
				}
				if strings.HasPrefix(r.Action, "inbox-") {
					recs = append(recs, r)
				}
			}
			if len(recs) != 3 {
				t.Fatalf("inbox audit rows: %+v; want 3 (one retry, two discards)", recs)
			}
			retry := recs[len(recs)-1] // newest first
			if retry.Action != "inbox-retry" || retry.Actor != "alice" || retry.Role != "operator" || retry.Reason != "customer imported" ||
				retry.EventID != event || !strings.Contains(retry.Detail, fmt.Sprintf("dead letter %d marked for retry", first)) {
				t.Fatalf("retry's audit row: %+v", retry)
			}
			for _, r := range recs[:2] {
				if r.Action != "inbox-discard" || r.Actor != "bob" {
					t.Fatalf("discard's audit row: %+v", r)
				}
			}
			if recs[1].EventID != event || recs[0].EventID != "" || !strings.Contains(recs[0].Detail, fmt.Sprintf("dead letter %d discarded", second)) {
				t.Fatalf("discard rows name the event when it is an event id: %+v", recs[:2])
			}

			// Bad input: one line, nothing changed.
			for _, bad := range []struct {
				args []string
				want string
			}{
				{[]string{"inbox", "dlq", "retry", "abc", "--consumer", "billing"}, `"abc" is not a dead letter's id`},
				{[]string{"inbox", "dlq", "discard", "999999", "--consumer", "billing"}, "consumer billing has no dead letter with id 999999"},
				{[]string{"inbox", "dlq", "list"}, "--consumer is required"},
				{[]string{"inbox", "dlq", "retry", "--consumer", "billing"}, "give dead letter ids or --all"},
				{[]string{"inbox", "dlq", "show", "7", "--consumer", "billing"}, "consumer billing has no dead letter 7"},
				{[]string{"inbox", "status", "--consumer", "billing", "--inbox-table", "x`y"}, "--inbox-table"},
			} {
				_, stderr, code := run(t, []string{"OUTBOX_DB="}, append(bad.args, it.flags...)...)
				line := strings.TrimRight(stderr, "\n")
				if code == 0 || strings.Contains(line, "\n") || !strings.Contains(line, bad.want) {
					t.Errorf("%v: exit %d, stderr %q; want one line with %q", bad.args, code, stderr, bad.want)
				}
			}
			if dls, err := other.DeadLetters(ctx, 10); err != nil || len(dls) != 1 {
				t.Fatalf("shipping's dead letters after bad input: %v, %v", dls, err)
			}
		})
	}
}
