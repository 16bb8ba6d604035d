package pgschema

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// SetWakeups creates (outboxdriver.WakeupsTrigger) or drops
// (outboxdriver.WakeupsWriters) t's notify trigger inside tx; "" changes
// nothing.
func SetWakeups(ctx context.Context, tx Tx, t outboxdriver.Table, mode string) error {
	var sql string
	switch mode {
	case "":
		return nil
	case outboxdriver.WakeupsTrigger:
		// DROP first: CREATE OR REPLACE TRIGGER is PostgreSQL 14's.
		sql = `DROP TRIGGER IF EXISTS {{notify_trg}} ON {{table}};
CREATE TRIGGER {{notify_trg}} AFTER INSERT ON {{table}} FOR EACH STATEMENT EXECUTE FUNCTION {{notify_fn}}()`
	case outboxdriver.WakeupsWriters:
		sql = `DROP TRIGGER IF EXISTS {{notify_trg}} ON {{table}}`
	default:
		return fmt.Errorf("wake-ups %q: use %q or %q", mode, outboxdriver.WakeupsTrigger, outboxdriver.WakeupsWriters)
	}
	if err := tx.Exec(ctx, Render(sql, t, Options{})); err != nil {
		return fmt.Errorf("set wake-ups to %s: %w", mode, err)
	}
	return nil
}

// WakeViewSQL reads what a writer's view of t's wake-ups holds, with the
// arguments of WakeViewArgs: the latest expiry of the relays' wake-up
// registrations and the database's clock, both in epoch milliseconds, and
// whether the table's notify trigger is there (enabled). Any role may run
// it: the sequence is readable by all since version 15, the catalog too. A
// table older than version 15 reads as having no registration.
const WakeViewSQL = `SELECT coalesce(pg_sequence_last_value(to_regclass($1)), 0),
       (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
       EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($2) AND tgname = $3 AND tgenabled <> 'D')`

// WakeViewArgs are WakeViewSQL's arguments for t.
func WakeViewArgs(t outboxdriver.Table) []any {
	return []any{t.Qualified("_awake"), t.Qualified(""), t.Name + "_notify"}
}

// WakeCTE is the CTE an INSERT of t's writers selects FROM when it may
// have to wake an idle relay itself (WakeView.Wake): it asks the server
// the notify trigger's question (does a relay's registration in
// <table>_awake outlive now? is outbox.notify not off?) and sends the
// table's NOTIFY only then. So a writer whose view is stale or not read
// yet costs the statement that check, about 2 µs, never a NOTIFY no relay
// waits for (a NOTIFY serialises commits; a busy machine, whose views lag,
// would pay it most). A table without the sequence (before version 15)
// reads as having no registration.
func WakeCTE(t outboxdriver.Table) string {
	return `WITH wake AS MATERIALIZED (SELECT CASE WHEN coalesce(pg_sequence_last_value(to_regclass(` + QuoteLiteral(t.Qualified("_awake")) + `)), 0) > (extract(epoch FROM now()) * 1000)::bigint
       AND lower(coalesce(current_setting('outbox.notify', true), '')) NOT IN ('off', 'false', 'no', '0') THEN pg_notify(` +
		QuoteLiteral(t.Channel()) + `, '') END)
`
}

// WakeView is a writer's view of whether relays wait for a wake-up on its
// tables, for tables without the notify trigger (outboxdriver.WakeupsWriters). Reads
// run in the background, one at a time per table, when a write finds the
// view half of driverkit.WakeViewMaxAge old; a write never waits for
// one. A WakeView is safe for concurrent use.
type WakeView struct {
	read func(ctx context.Context, t outboxdriver.Table) (awakeMs, nowMs int64, trigger bool, err error)
	now  func() time.Time // the clock; time.Now but in tests (SetClock)

	mu     sync.Mutex
	tables map[outboxdriver.Table]*wakeState
}

// triggerRecheck is how often a writer asks again whether a table that
// had its notify trigger still has it: a table moved to WakeupsWriters is
// served by its writers' wake-ups within that time.
const triggerRecheck = 5 * time.Second

type wakeState struct {
	known   bool      // a read succeeded
	trigger bool      // the table has its notify trigger
	started time.Time // when the last successful read began
	tried   time.Time // when the last read began, whether it came back or failed
	until   time.Time // until when, at the latest, a relay waits
	reading bool
}

// NewWakeView returns a view that reads with read, which runs WakeViewSQL.
func NewWakeView(read func(ctx context.Context, t outboxdriver.Table) (awakeMs, nowMs int64, trigger bool, err error)) *WakeView {
	return &WakeView{read: read, now: time.Now, tables: map[outboxdriver.Table]*wakeState{}}
}

// Wake reports whether an INSERT into t about to be sent must carry the
// wake-up's check (WakeCTE). It does while a view of t younger than
// WakeViewMaxAge says a relay waits, while the view is older than that,
// and before the first read of the view came back: then the server
// answers, as the trigger would. It does not while the table has its
// trigger, which wakes relays for every writer.
func (v *WakeView) Wake(t outboxdriver.Table) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	s := v.state(t)
	due := driverkit.WakeViewMaxAge / 2
	if s.trigger {
		// The trigger wakes relays; only whether it is still there is
		// worth asking, and seldom.
		due = triggerRecheck
	}
	// Reads are due by the last attempt, so that a read that keeps
	// failing is tried again at that pace, not on every write.
	if !s.reading && (s.tried.IsZero() || now.Sub(s.tried) >= due) {
		s.reading, s.tried = true, now
		go v.refresh(t, s)
	}
	switch {
	case s.trigger:
		return false
	case !s.known, now.Sub(s.started) >= driverkit.WakeViewMaxAge:
		// No view, or one too old to rule a waiting relay out: the
		// statement asks the server (WakeCTE). A table that has its
		// trigger notifies once for both (PostgreSQL sends one
		// notification per channel and payload per transaction), and
		// only while a relay waits, as the trigger alone would.
		return true
	default:
		return now.Before(s.until)
	}
}

// reading reports whether a read of t's view is under way.
func (v *WakeView) reading(t outboxdriver.Table) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.state(t).reading
}

// state returns t's state, made on first use; v.mu is held.
func (v *WakeView) state(t outboxdriver.Table) *wakeState {
	s := v.tables[t]
	if s == nil {
		s = &wakeState{}
		v.tables[t] = s
	}
	return s
}

// Hold reads t's view now, after any background read of it has come
// back, and then holds the view's age at age: the clock stops at the
// read's start plus age. For tests, which need the view's age exact
// however slowly a busy machine runs them; SetClock(t, time.Now) lets it
// run again. While it reads, no background read starts, so none can land
// after it. Writers never wait for a read.
func (v *WakeView) Hold(ctx context.Context, t outboxdriver.Table, age time.Duration) error {
	var s *wakeState
	for {
		v.mu.Lock()
		s = v.state(t)
		if !s.reading {
			s.reading = true
			v.now = time.Now
			v.mu.Unlock()
			break
		}
		v.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	if err := v.refreshWith(ctx, t, s); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	held := s.started.Add(age)
	v.now = func() time.Time { return held }
	return nil
}

// SetClock makes v read the time with now: for tests. It returns the time
// the last read of t that came back began (zero if none).
func (v *WakeView) SetClock(t outboxdriver.Table, now func() time.Time) time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.now = now
	return v.state(t).started
}

// refresh reads t's view in the background. A failed read leaves the view
// as it was, ageing: past WakeViewMaxAge writers wake relays again, unless
// the table had the trigger or no read ever succeeded; the next read is
// due as after one that came back.
func (v *WakeView) refresh(t outboxdriver.Table, s *wakeState) {
	ctx, cancel := context.WithTimeout(context.Background(), driverkit.WakeViewReadTimeout)
	defer cancel()
	_ = v.refreshWith(ctx, t, s)
}

func (v *WakeView) refreshWith(ctx context.Context, t outboxdriver.Table, s *wakeState) error {
	v.mu.Lock()
	start := v.now()
	s.tried = start
	v.mu.Unlock()
	awake, now, trigger, err := v.read(ctx, t)
	v.mu.Lock()
	defer v.mu.Unlock()
	end := v.now()
	s.reading = false
	if err != nil {
		return err
	}
	if start.Before(s.started) {
		return nil // a later read came back first
	}
	// The registration's expiry on the local clock, counted from the
	// read's end: never earlier than the database's.
	s.known, s.trigger, s.started = true, trigger, start
	s.until = end.Add(time.Duration(awake-now) * time.Millisecond)
	return nil
}
