package pgschema

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/outboxdriver"
)

// pqError has the method of lib/pq's *pq.Error that NoSlot reads the hint
// through (lib/pq is no dependency of this module).
type pqError struct{ hint string }

func (e *pqError) Error() string { return "pq: refused" }
func (e *pqError) Get(k byte) string {
	if k == 'H' {
		return e.hint
	}
	return ""
}

// The refusal of _cdc_slot is ErrNoSlot whichever driver reports it, and
// nothing else is.
func TestNoSlotMarksTheRefusalOnly(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "P0001", Hint: NoSlotHint}, true},
		{fmt.Errorf("commit: %w", &pgconn.PgError{Code: "P0001", Hint: NoSlotHint}), true},
		{&pqError{hint: NoSlotHint}, true},
		{&pgconn.PgError{Code: "P0001", Hint: "other"}, false},
		{&pqError{hint: ""}, false},
		{errors.New("outbox-no-slot"), false},
	} {
		err := NoSlot(c.err)
		if got := errors.Is(err, outboxdriver.ErrNoSlot); got != c.want {
			t.Errorf("NoSlot(%v) is ErrNoSlot: %v, want %v", c.err, got, c.want)
		}
		if !errors.Is(err, c.err) || err.Error() != c.err.Error() {
			t.Errorf("NoSlot(%v) = %v: the database's error is lost", c.err, err)
		}
	}
	if NoSlot(nil) != nil {
		t.Error("NoSlot(nil) != nil")
	}
}

// The database/sql form sends one argument per column of each event, each
// named once in the ARRAY constructors, in order.
func TestScalarCallsNameEveryArgumentOnce(t *testing.T) {
	rows := []outboxdriver.Row{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	for name, call := range map[string]func(outboxdriver.Table, []outboxdriver.Row, ArgStyle) (string, []any){"emit": EmitCall, "write": WriteCall} {
		sql, args := call(outboxdriver.Table{}, rows, Scalars)
		for i := 1; i <= len(args); i++ {
			if n := strings.Count(sql+" ", fmt.Sprintf("$%d::", i)); n != 1 {
				t.Errorf("%s: $%d named %d times in %s", name, i, n, sql)
			}
		}
		if strings.Contains(sql, fmt.Sprintf("$%d", len(args)+1)) {
			t.Errorf("%s: %s names more arguments than the %d given", name, sql, len(args))
		}
	}
}
