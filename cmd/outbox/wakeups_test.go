package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testenv"
)

// migrate --wakeups writers drops the notify trigger and says what that
// means; a migrate without the flag leaves the table as it is; --wakeups
// trigger puts the trigger back; status says which. A bad value, the flag with --inbox or
// --down, and the flag on a database without wake-ups are refused in one
// line, changing nothing.
func TestMigrateWakeups(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	flags := []string{"migrate", "--db", dbURL(), "--schema", tb.Schema, "--table", tb.Name}
	trigger := func() bool {
		t.Helper()
		var has bool
		if err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)`,
			tb.Qualified(""), tb.Name+"_notify").Scan(&has); err != nil {
			t.Fatal(err)
		}
		return has
	}
	for _, step := range []struct {
		args []string
		say  string
		want bool
	}{
		{nil, "applied migration(s)", false}, // a new table: writers' wake-ups
		{[]string{"--wakeups", "trigger"}, "idle relays are woken by the notify trigger, for every writer", true},
		{[]string{"--wakeups", "writers"}, "idle relays are woken by the library's writers; no trigger", false},
		{nil, "nothing to do", false},
		{[]string{"--wakeups", "trigger"}, "idle relays are woken by the notify trigger, for every writer", true},
	} {
		out, stderr, code := run(t, nil, append(flags, step.args...)...)
		if code != 0 || !strings.Contains(out, step.say) {
			t.Fatalf("migrate %v: code %d, %q %q, want %q", step.args, code, out, stderr, step.say)
		}
		if got := trigger(); got != step.want {
			t.Fatalf("after migrate %v: notify trigger there %v, want %v", step.args, got, step.want)
		}
		wantStatus := `"wakeups":"writers"`
		if step.want {
			wantStatus = `"wakeups":"trigger"`
		}
		if out, stderr, code := run(t, nil, append([]string{"status", "--json"}, flags[1:]...)...); code != 0 || !strings.Contains(out, wantStatus) {
			t.Fatalf("status --json after migrate %v: code %d, %q %q, want %s", step.args, code, out, stderr, wantStatus)
		}
	}
	failsWithOneLine(t, nil, `wake-ups "sometimes": use "trigger" or "writers"`, append(flags, "--wakeups", "sometimes")...)
	failsWithOneLine(t, nil, "--wakeups goes with the outbox table's migration, not with --inbox or --down", append(flags, "--wakeups", "writers", "--down", "17")...)
	failsWithOneLine(t, nil, "--wakeups goes with the outbox table's migration, not with --inbox or --down", append(flags, "--wakeups", "writers", "--inbox")...)
	if !trigger() {
		t.Fatal("a refused migrate dropped the notify trigger")
	}
	failsWithOneLine(t, nil, "wake-ups are chosen on PostgreSQL only: relays on this database poll",
		"migrate", "--db", "sqlite://"+filepath.Join(t.TempDir(), "app.db"), "--wakeups", "writers")
}
