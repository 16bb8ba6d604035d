package cdc_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
)

// streamerName is how the relays' listing names the streamer of the
// fixture's slot whose owner is owner.
func (f *cdcFixture) streamerName(owner string) string {
	return owner + " (log tailing, slot " + f.slot() + ")"
}

// liveStreamer waits until the listing of the table's relays holds the
// live streamer name and returns it.
func (f *cdcFixture) liveStreamer(name string) outboxdriver.RelayStatus {
	f.t.Helper()
	var got outboxdriver.RelayStatus
	await.Eventually(f.t, 90*time.Second, func() error {
		rs, err := f.drv.Relays(f.ctx, f.tb)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Name == name && r.ExpiresIn > 0 {
				got = r
				return nil
			}
		}
		return fmt.Errorf("relays %+v: %s is not listed alive", rs, name)
	})
	return got
}

// A streamer records its schema version and release with the slot's
// lease, and Migrate counts it among the live relays: a pending migration
// whose floor is above its version is refused, naming the streamer, its
// slot and its version, and nothing is applied; a streamer that took the
// lease without recording (a release before version 25) counts as older.
// Once it gave the lease up, it is no longer listed alive.
//
// Migration 18 (floor 18) is made pending by deleting its row from the
// bookkeeping: its floor is the only one the streamer of version 17 does
// not meet, and the refusal comes before anything is applied.
func TestCDCMigrateRefusesWhileAnOlderStreamerIsAlive(t *testing.T) {
	f := newCDC(t)
	f.setup()
	src := f.source("r-old", nil)
	cdc.SetRelayLatest(src, 17)
	f.exec(`DELETE FROM ` + f.tb.Qualified("_migrations") + ` WHERE version = 18`)
	t.Cleanup(func() {
		f.exec(`INSERT INTO ` + f.tb.Qualified("_migrations") + ` (version, name, relays_from) VALUES (18, 'partition_derived', 18) ON CONFLICT DO NOTHING`)
	})
	stop := f.relay(src, relay.Config{})
	f.streaming()
	r := f.liveStreamer(f.streamerName("r-old"))
	if r.SchemaVersion != 17 || r.RenewedAt.IsZero() || r.Started.IsZero() {
		t.Fatalf("streamer listed as %+v; want schema version 17, a start and a renewal", r)
	}

	var err error
	f.ddl(func() { _, err = f.drv.Migrate(f.ctx, f.tb, nil) })
	var behind *outboxdriver.RelaysBehindError
	if !errors.As(err, &behind) {
		t.Fatalf("Migrate with a streamer of version 17 alive = %v; want a *RelaysBehindError", err)
	}
	if len(behind.Relays) != 1 || behind.Relays[0].Name != f.streamerName("r-old") || behind.Relays[0].SchemaVersion != 17 ||
		len(behind.Migrations) != 1 || behind.Migrations[0].Version != 18 {
		t.Fatalf("error %+v; want the streamer r-old (version 17) holding up migration 18", behind)
	}
	for _, want := range []string{"018_partition_derived", f.streamerName("r-old") + " (schema version 17", "--force"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error does not say %q: %v", want, err)
		}
	}
	var n int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM `+f.tb.Qualified("_migrations")+` WHERE version = 18`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("migration 18 recorded %d times (%v) after the refusal; want none applied", n, err)
	}

	// A streamer of a release before version 25 takes a lease without
	// recording anything: of an unknown version, older than every one.
	f.exec(`INSERT INTO ` + f.tb.Qualified("_cdc") + ` (slot, publication, owner, epoch, expires_at)
VALUES ('other_slot', 'other_pub', 'r-older', 1, clock_timestamp() + interval '10 minutes')`)
	f.ddl(func() { _, err = f.drv.Migrate(f.ctx, f.tb, nil) })
	if !errors.As(err, &behind) || len(behind.Relays) != 2 {
		t.Fatalf("Migrate with two streamers alive = %v; want a *RelaysBehindError naming both", err)
	}
	if want := "r-older (log tailing, slot other_slot) (schema version unknown"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error does not say %q: %v", want, err)
	}
	f.exec(`DELETE FROM ` + f.tb.Qualified("_cdc") + ` WHERE slot = 'other_slot'`)

	// Stopped, the relay gives the slot's lease up: no streamer is alive.
	stop()
	rs, err := f.drv.Relays(f.ctx, f.tb)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.ExpiresIn > 0 {
			t.Fatalf("relay %+v still alive after the streamer stopped", r)
		}
	}
}

// A streamer of the release before (its code knows one version less) on a
// table at the latest version streams while the newest migration works
// with it; once the table records that it needs relays of the latest
// version, the relay says so once in an error line, gives the slot's
// lease up (nobody streams it), stops claiming and is not ready; when the
// table works with it again, it streams again and publishes what was
// written meanwhile.
func TestCDCRelayOfTheReleaseBeforeOnANewerTable(t *testing.T) {
	f := newCDC(t)
	f.setup()
	latest := pgschema.Latest()
	src := f.source("r-old", nil)
	cdc.SetRelayLatest(src, latest-1)
	log := &testenv.Buffer{}
	old, _ := f.startRelay(src, f.natsSink(), relay.Config{
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	f.streaming()
	ob := f.writer(modeTable)
	first := []string{}
	for i := range 5 {
		e := cdcEvent(fmt.Sprintf("a%d", i), i)
		first = append(first, e.ID)
		f.write(ob, e)
	}
	f.waitFor(first...)
	if c, ok := old.SchemaCheck(); !ok || !c.Compatible() || c.TableVersion != latest || c.RelayVersion != latest-1 {
		t.Fatalf("the streamer's schema check %+v (checked %v); want table %d, relay %d, compatible", c, ok, latest, latest-1)
	}
	if r := f.liveStreamer(f.streamerName("r-old")); r.SchemaVersion != latest-1 {
		t.Fatalf("streamer listed as %+v; want schema version %d", r, latest-1)
	}

	// What a migration with "-- relays: from <latest>" records.
	f.exec(`UPDATE `+f.tb.Qualified("_migrations")+` SET relays_from = $1 WHERE version = $1`, latest)
	await.Eventually(t, 90*time.Second, func() error {
		if c, _ := old.SchemaCheck(); c.Compatible() {
			return errors.New("the streamer still finds the table compatible")
		}
		if old.Ready() {
			return errors.New("the streamer is still ready")
		}
		if n := len(old.Partitions()); n > 0 {
			return fmt.Errorf("the streamer still holds %d partitions", n)
		}
		if f.streamed() {
			return errors.New("the slot is still streamed")
		}
		rs, err := f.drv.Relays(f.ctx, f.tb)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.ExpiresIn > 0 {
				return fmt.Errorf("relay %+v still holds a lease", r)
			}
		}
		return nil
	})
	if n := strings.Count(log.String(), "level=ERROR msg=\"relay: the outbox table needs a newer relay"); n != 1 {
		t.Fatalf("%d error lines about the newer table; want 1:\n%s", n, log)
	}
	for _, want := range []string{fmt.Sprintf("table_schema_version=%d", latest), fmt.Sprintf("relays_from=%d", latest),
		fmt.Sprintf("relay_schema_version=%d", latest-1)} {
		if !strings.Contains(log.String(), want) {
			t.Fatalf("the error line does not say %s:\n%s", want, log)
		}
	}
	// Written while it stands still: nobody streams the slot, and the
	// slot keeps them.
	second := []string{}
	for i := range 5 {
		e := cdcEvent(fmt.Sprintf("b%d", i), i)
		second = append(second, e.ID)
		f.write(ob, e)
	}
	if f.streamed() || old.Ready() {
		t.Fatal("the streamer of the release before streams again while the table needs a newer relay")
	}

	f.exec(`UPDATE `+f.tb.Qualified("_migrations")+` SET relays_from = 0 WHERE version = $1`, latest)
	await.Eventually(t, 90*time.Second, func() error {
		if !old.Ready() {
			return errors.New("the streamer is not ready again")
		}
		return nil
	})
	f.waitFor(second...)
	if !strings.Contains(log.String(), "works with this relay again") {
		t.Fatalf("the streamer did not say it claims again:\n%s", log)
	}
}
