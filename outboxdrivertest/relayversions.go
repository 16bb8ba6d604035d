package outboxdrivertest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// testRelayVersions: a Source records, with every heartbeat, the newest
// schema version its code knows, its release and when it renewed, and
// Relays lists them; it tells the relay whether its code works with the
// table (outboxdriver.SchemaChecker). On a table migrated only to the
// version before deliver_at (whose migration older relays cannot work
// with: they would publish delayed events at once), a relay registers
// without a version, so Migrate refuses while it is alive, naming it and
// applying nothing, and goes through with IgnoreRelaysBehind.
func (s *suite) testRelayVersions(t *testing.T) {
	e := s.newEnv(t, partitions)
	latest := s.h.Store.LatestVersion()
	before := s.h.DeliverAtVersion - 1
	if _, err := s.h.Store.MigrateDown(e.ctx, e.table, before); err != nil {
		t.Fatalf("%s: migrate down to %d: %v", s.h.Name, before, err)
	}
	src := e.source(outboxdriver.SourceConfig{RelayName: "relay-versions"})
	if _, _, err := src.Heartbeat(e.ctx, time.Minute); err != nil {
		t.Fatalf("%s: heartbeat: %v", s.h.Name, err)
	}
	_, err := s.h.Store.Migrate(e.ctx, e.table, nil)
	var behind *outboxdriver.RelaysBehindError
	if !errors.As(err, &behind) {
		t.Fatalf("%s: Migrate from %d with a relay of unknown version alive = %v; want a *RelaysBehindError", s.h.Name, before, err)
	}
	if len(behind.Relays) != 1 || behind.Relays[0].Name != "relay-versions" || behind.Relays[0].SchemaVersion != 0 ||
		len(behind.Migrations) == 0 || behind.Migrations[0].Version != s.h.DeliverAtVersion ||
		!strings.Contains(err.Error(), "relay-versions") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("%s: %v (%+v); want relay-versions, of unknown version, holding up migration %d", s.h.Name, err, behind, s.h.DeliverAtVersion)
	}
	if st, err := s.h.Store.Status(e.ctx, e.table); err != nil || st.SchemaVersion != before {
		t.Fatalf("%s: after the refusal the table is at %d (%v); want %d", s.h.Name, st.SchemaVersion, err, before)
	}
	if _, err := s.h.Store.Migrate(e.ctx, e.table, &outboxdriver.MigrateOptions{IgnoreRelaysBehind: true}); err != nil {
		t.Fatalf("%s: Migrate with IgnoreRelaysBehind: %v", s.h.Name, err)
	}
	await.Eventually(t, 30*time.Second, func() error {
		if _, _, err := src.Heartbeat(e.ctx, time.Minute); err != nil {
			return err
		}
		rs, err := s.h.Store.Relays(e.ctx, e.table)
		if err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Name != "relay-versions" || rs[0].SchemaVersion != latest || rs[0].Release == "" ||
			rs[0].RenewedAt.IsZero() || time.Since(rs[0].RenewedAt).Abs() > time.Hour {
			return fmt.Errorf("relays %+v; want relay-versions at schema version %d with a release and a renewal time", rs, latest)
		}
		return nil
	})
	sc, ok := src.(outboxdriver.SchemaChecker)
	if !ok {
		t.Fatalf("%s: the Source is no outboxdriver.SchemaChecker", s.h.Name)
	}
	c, err := sc.CheckSchema(e.ctx)
	if err != nil || c.TableVersion != latest || c.RelayVersion != latest || !c.Compatible() || c.RelaysFrom < s.h.DeliverAtVersion {
		t.Fatalf("%s: CheckSchema = %+v, %v; want table and relay at %d, relays from %d or later, compatible", s.h.Name, c, err, latest, s.h.DeliverAtVersion)
	}
	if st, err := s.h.Store.Status(e.ctx, e.table); err != nil || st.RelaysFrom != c.RelaysFrom {
		t.Fatalf("%s: Status relays from %d (%v); want %d as CheckSchema", s.h.Name, st.RelaysFrom, err, c.RelaysFrom)
	}
}
