package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestShortRun runs the example with 40 orders in a schema and stream of
// its own and checks its report: 40 orders, 40 invoices, none twice, the
// 4 copies (10%) suppressed, nothing left in the outbox, exit code 0.
func TestShortRun(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Table(t, pool).Schema // dropped when the test ends
	_, js := testenv.JetStream(t)
	stream := strings.ToUpper(testenv.Name("ob"))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})
	var out, errb bytes.Buffer
	code := run(testenv.Context(t, 3*time.Minute), []string{
		"--db", testenv.DatabaseURL(), "--nats", testenv.NATSURL(),
		"--schema", schema, "--stream", stream, "--orders", "40", "--redeliver", "10",
	}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{
		`(?m)^orders: +40$`, `(?m)^invoices: +40$`, `(?m)^orders invoiced twice: +0$`,
		`(?m)^duplicates suppressed: +([4-9]|\d\d+)$`, `(?m)^outbox backlog: +0$`, `(?m)^OK: exactly one invoice per order$`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("report lacks %s:\n%s", want, out.String())
		}
	}
	// The chain: every invoice wrote an InvoiceCreated event, published to
	// <stream>.invoice.
	st, err := js.Stream(testenv.Context(t, 10*time.Second), stream)
	if err != nil {
		t.Fatal(err)
	}
	subject := strings.ToLower(stream) + ".invoice"
	info, err := st.Info(testenv.Context(t, 10*time.Second), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[subject]; n != 40 {
		t.Errorf("%d InvoiceCreated events in the stream, want 40", n)
	}
	if _, err := pool.Exec(testenv.Context(t, 10*time.Second), `SELECT 1 FROM `+outboxdriver.QuoteIdent(schema)+`.inbox LIMIT 1`); err != nil {
		t.Errorf("the inbox table was not migrated: %v", err)
	}
}

// TestBadFlags: bad input is refused with a one-line error and exit code 2.
func TestBadFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--orders", "0"}, "--orders 0"},
		{[]string{"--redeliver", "101"}, "--redeliver 101"},
		{[]string{"--schema", `x"; DROP TABLE y; --`}, "--schema"},
		{[]string{"--stream", "a.b"}, "--stream"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) ||
			strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
			t.Errorf("run(%q) = %d, stderr %q; want 2 and one line with %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
