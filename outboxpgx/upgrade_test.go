package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// upgradeRig is a table, the events written to it and what its relays
// published.
type upgradeRig struct {
	t       *testing.T
	pool    *pgxpool.Pool
	tb      outboxdriver.Table
	drv     *outboxpgx.Driver
	out     *published
	written int
}

func newUpgradeRig(t *testing.T, ctx context.Context, version int) *upgradeRig {
	t.Helper()
	pool := testenv.PoolMax(t, 12)
	r := &upgradeRig{t: t, pool: pool, tb: testenv.Table(t, pool), drv: outboxpgx.New(pool),
		out: &published{order: map[string][]int{}, copies: map[string]int{}}}
	if _, err := r.drv.Migrate(ctx, r.tb, nil); err != nil {
		t.Fatal(err)
	}
	if version < pgschema.Latest() {
		if _, err := r.drv.MigrateDown(ctx, r.tb, version); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// write inserts n events with plain SQL, as any writer of any release.
func (r *upgradeRig) write(ctx context.Context, n int) {
	r.t.Helper()
	if _, err := r.pool.Exec(ctx, `INSERT INTO `+r.tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', 'a' || (g % 16), 'Placed', json_build_object('n', $2::int + g + 1)
FROM generate_series(0, $1 - 1) AS g ORDER BY g`, n, r.written); err != nil {
		r.t.Fatal(err)
	}
	r.written += n
}

// relay starts a relay of this code named name (latest: the newest schema
// version its code knows) and returns it, its log, and what stops it.
func (r *upgradeRig) relay(ctx context.Context, name string, latest int) (*relay.Relay, *testenv.Buffer, func()) {
	r.t.Helper()
	src, err := r.drv.NewSource(r.tb, &outboxdriver.SourceConfig{RelayName: name})
	if err != nil {
		r.t.Fatal(err)
	}
	outboxpgx.SetRelayLatest(src, latest)
	router, err := route.New(&route.Config{})
	if err != nil {
		r.t.Fatal(err)
	}
	log := &testenv.Buffer{}
	rl, err := relay.New(src, stdoutsink.New(r.out), &relay.Config{
		BatchSize: 50, Lanes: 2, LeaseTTL: 2 * time.Second, PollInterval: 20 * time.Millisecond, Router: router,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return rl, log, startRelay(ctx, r.t, rl, src)
}

// drained waits until every event written was published, once at least,
// and each aggregate's in order.
func (r *upgradeRig) drained() {
	r.t.Helper()
	await.Eventually(r.t, 2*time.Minute, func() error {
		r.out.mu.Lock()
		defer r.out.mu.Unlock()
		if r.out.err != nil {
			return r.out.err
		}
		if len(r.out.copies) != r.written {
			return fmt.Errorf("%d of %d events published", len(r.out.copies), r.written)
		}
		return nil
	})
	r.out.mu.Lock()
	defer r.out.mu.Unlock()
	for agg, ns := range r.out.order {
		for i := 1; i < len(ns); i++ {
			if ns[i] <= ns[i-1] {
				r.t.Fatalf("aggregate %s published out of order: %v", agg, ns)
			}
		}
	}
}

// liveRelays waits until the named relays are registered and alive.
func (r *upgradeRig) liveRelays(ctx context.Context, names ...string) []outboxdriver.RelayStatus {
	r.t.Helper()
	var live []outboxdriver.RelayStatus
	await.Eventually(r.t, time.Minute, func() error {
		all, err := r.drv.Relays(ctx, r.tb)
		if err != nil {
			return err
		}
		live = live[:0]
		for _, x := range all {
			if x.ExpiresIn > 0 {
				live = append(live, x)
			}
		}
		if len(live) != len(names) {
			return fmt.Errorf("%d live relays; want %v", len(live), names)
		}
		return nil
	})
	return live
}

// hasFloorAfter reports whether a migration after version v declares a
// relays floor: relays of an unknown version then hold the migration up.
func hasFloorAfter(v int) bool {
	for w := v + 1; w <= pgschema.Latest(); w++ {
		if pgschema.RelaysFrom(w) > pgschema.RelaysFrom(w-1) {
			return true
		}
	}
	return false
}

// From every earlier schema version a table is migrated to the latest
// while two relays of this code are registered and hold leases: the
// migration refuses, naming them, when a pending migration declares a
// relays floor (relays on a table before version 20 cannot record their
// version, so they count as older), and goes through with
// IgnoreRelaysBehind; the relays then record their version and publish
// every event written before, during and after: none lost, each
// aggregate's in order.
func TestMigrateFromEachVersionWithRelaysRunning(t *testing.T) {
	t.Parallel()
	latest := pgschema.Latest()
	for v := 2; v < latest; v++ {
		t.Run(fmt.Sprintf("from%d", v), func(t *testing.T) {
			t.Parallel()
			ctx := testenv.Context(t, 4*time.Minute)
			r := newUpgradeRig(t, ctx, v)
			r.write(ctx, 50)
			_, _, stopA := r.relay(ctx, "relay-a", latest)
			defer stopA()
			_, _, stopB := r.relay(ctx, "relay-b", latest)
			defer stopB()
			r.liveRelays(ctx, "relay-a", "relay-b")
			r.write(ctx, 50)

			_, err := r.drv.Migrate(ctx, r.tb, nil)
			var behind *outboxdriver.RelaysBehindError
			if hasFloorAfter(v) {
				if !errors.As(err, &behind) {
					t.Fatalf("Migrate from %d with relays of unknown version = %v; want a *RelaysBehindError", v, err)
				}
				if len(behind.Relays) != 2 || !strings.Contains(err.Error(), "relay-a") || !strings.Contains(err.Error(), "relay-b") ||
					!strings.Contains(err.Error(), "--force") {
					t.Fatalf("error names relays %v: %v", behind.Relays, err)
				}
				if st, err := r.drv.Status(ctx, r.tb); err != nil || st.SchemaVersion != v {
					t.Fatalf("after the refusal the table is at %d (%v); want %d, nothing applied", st.SchemaVersion, err, v)
				}
				r.write(ctx, 50)
				if _, err = r.drv.Migrate(ctx, r.tb, &outboxdriver.MigrateOptions{IgnoreRelaysBehind: true}); err != nil {
					t.Fatalf("Migrate with IgnoreRelaysBehind: %v", err)
				}
			} else if err != nil {
				t.Fatalf("Migrate from %d (no relays floor pending) with relays running: %v", v, err)
			}
			r.write(ctx, 50)
			r.drained()
			await.Eventually(t, time.Minute, func() error {
				for _, x := range r.liveRelays(ctx, "relay-a", "relay-b") {
					if x.SchemaVersion != latest || x.RenewedAt.IsZero() {
						return fmt.Errorf("relay %s records schema version %d, renewed %v; want %d and a time", x.Name, x.SchemaVersion, x.RenewedAt, latest)
					}
				}
				return nil
			})
		})
	}
}

// A relay of the release before (its code knows one version less) on a
// table at the latest version publishes while the newest migration works
// with it; once the table records that it needs relays of the latest
// version, the relay says so once in an error line, stops claiming, gives
// its partitions up and is not ready, and a relay of this release
// publishes everything; when the table works with it again, it claims
// again.
func TestRelayOfTheReleaseBeforeOnANewerTable(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 4*time.Minute)
	latest := pgschema.Latest()
	r := newUpgradeRig(t, ctx, latest)
	old, oldLog, stopOld := r.relay(ctx, "relay-old", latest-1)
	defer stopOld()
	r.write(ctx, 300)
	r.drained()
	if c, ok := old.SchemaCheck(); !ok || !c.Compatible() || c.TableVersion != latest || c.RelayVersion != latest-1 {
		t.Fatalf("old relay's schema check %+v (checked %v); want table %d, relay %d, compatible", c, ok, latest, latest-1)
	}
	if !strings.Contains(oldLog.String(), "newer than this relay's, and works with it") {
		t.Fatalf("the old relay did not say that the table is newer but compatible:\n%s", oldLog)
	}

	// What a migration with "-- relays: from <latest>" records.
	if _, err := r.pool.Exec(ctx, `UPDATE `+r.tb.Qualified("_migrations")+` SET relays_from = $1 WHERE version = $1`, latest); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, time.Minute, func() error {
		if c, _ := old.SchemaCheck(); c.Compatible() {
			return errors.New("the old relay still finds the table compatible")
		}
		if old.Ready() {
			return errors.New("the old relay is still ready")
		}
		if n := len(old.Partitions()); n > 0 {
			return fmt.Errorf("the old relay still holds %d partitions", n)
		}
		return nil
	})
	if n := strings.Count(oldLog.String(), "level=ERROR msg=\"relay: the outbox table needs a newer relay"); n != 1 {
		t.Fatalf("%d error lines about the newer table; want 1:\n%s", n, oldLog)
	}
	for _, want := range []string{fmt.Sprintf("table_schema_version=%d", latest), fmt.Sprintf("relay_schema_version=%d", latest-1)} {
		if !strings.Contains(oldLog.String(), want) {
			t.Fatalf("the error line does not say %s:\n%s", want, oldLog)
		}
	}
	if st, err := r.drv.Status(ctx, r.tb); err != nil || st.RelaysFrom != latest {
		t.Fatalf("status relays from %d (%v); want %d", st.RelaysFrom, err, latest)
	}
	// It holds no partition, so it claims nothing; a relay of this
	// release takes them all.
	r.write(ctx, 100)
	_, _, stopNew := r.relay(ctx, "relay-new", latest)
	defer stopNew()
	r.drained()

	if _, err := r.pool.Exec(ctx, `UPDATE `+r.tb.Qualified("_migrations")+` SET relays_from = 0 WHERE version = $1`, latest); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, time.Minute, func() error {
		if !old.Ready() {
			return errors.New("the old relay is not ready again")
		}
		return nil
	})
	if !strings.Contains(oldLog.String(), "works with this relay again") {
		t.Fatalf("the old relay did not say it claims again:\n%s", oldLog)
	}
}

// The scenario: a relay of a release before schema version 20
// registers the way it always did (no version); a migration that needs
// newer relays refuses while it is alive, naming it as of an unknown
// version, and applies nothing.
func TestMigrateRefusesWhileARelayOfUnknownVersionIsAlive(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	r := newUpgradeRig(t, ctx, 17)
	if _, err := r.pool.Exec(ctx, `INSERT INTO `+r.tb.Qualified("_relays")+` (relay, expires_at) VALUES ('old-relay', clock_timestamp() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	_, err := r.drv.Migrate(ctx, r.tb, nil)
	var behind *outboxdriver.RelaysBehindError
	if !errors.As(err, &behind) {
		t.Fatalf("Migrate = %v; want a *RelaysBehindError", err)
	}
	if len(behind.Relays) != 1 || behind.Relays[0].Name != "old-relay" || behind.Relays[0].SchemaVersion != 0 ||
		len(behind.Migrations) != 1 || behind.Migrations[0].Version != 18 {
		t.Fatalf("error %+v; want old-relay (version unknown) holding up migration 18", behind)
	}
	for _, want := range []string{"old-relay", "schema version unknown", "018_partition_derived", "replace them with this release first, or run again with --force"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error does not say %q: %v", want, err)
		}
	}
	if st, err := r.drv.Status(ctx, r.tb); err != nil || st.SchemaVersion != 17 {
		t.Fatalf("table at %d (%v) after the refusal; want 17", st.SchemaVersion, err)
	}
	// Once it is gone (its registration expired), the migration goes through.
	if _, err := r.pool.Exec(ctx, `UPDATE `+r.tb.Qualified("_relays")+` SET expires_at = clock_timestamp() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if _, err := r.drv.Migrate(ctx, r.tb, nil); err != nil {
		t.Fatalf("Migrate once the old relay is gone: %v", err)
	}
}
