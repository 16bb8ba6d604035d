package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// The rolling upgrade: a table at schema version 17, a relay of an
// earlier release (registered the way it registers: no version) and one of
// this release that started before the migration. `outbox migrate` lists
// both, refuses with one line naming them and saying what to do, and
// applies nothing; `--force` applies the migrations, and `outbox status`
// then shows the floor and the relay behind it, while the relay of this
// release publishes every event.
func TestMigrateRefusesWhileOlderRelaysRun(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	flags := []string{"--db", dbURL(), "--schema", tb.Schema, "--table", tb.Name}
	if _, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	if _, stderr, code := run(t, nil, append([]string{"migrate", "--down", "17"}, flags...)...); code != 0 {
		t.Fatalf("migrate --down 17: %s", stderr)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("_relays")+` (relay, expires_at) VALUES ('old-relay', clock_timestamp() + interval '10 minutes')`); err != nil {
		t.Fatal(err)
	}
	startRelay(t, append([]string{"--sink", "stdout:", "--lease-ttl", "2s", "--poll-interval", "50ms"}, flags...)...)
	var newRelay string
	await.Eventually(t, time.Minute, func() error {
		err := pool.QueryRow(ctx, `SELECT relay FROM `+tb.Qualified("_relays")+` WHERE relay <> 'old-relay'`).Scan(&newRelay)
		if err != nil {
			return fmt.Errorf("the relay has not registered: %v", err)
		}
		return nil
	})
	write := func(n int) {
		if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', 'o' || (g % 8), 'Placed', '{}' FROM generate_series(1, $1) AS g`, n); err != nil {
			t.Fatal(err)
		}
	}
	write(50)

	out, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...)
	line := strings.TrimRight(stderr, "\n")
	if code == 0 || strings.Contains(line, "\n") {
		t.Fatalf("migrate with older relays alive: exit %d, stderr %q; want one line and a failure", code, stderr)
	}
	for _, want := range []string{"refusing to migrate", "018_partition_derived", "old-relay (schema version unknown", newRelay + " (schema version unknown",
		"replace them with this release first, or run again with --force"} {
		if !strings.Contains(line, want) {
			t.Fatalf("stderr %q does not say %q", line, want)
		}
	}
	for _, want := range []string{"2 live relay(s)", "old-relay: schema version unknown (an older release), last renewed unknown", newRelay + ": schema version unknown"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stdout %q does not list %q", out, want)
		}
	}
	st := statusJSONOf(t, flags)
	if st.SchemaVersion != 17 {
		t.Fatalf("schema version %d after the refusal; want 17", st.SchemaVersion)
	}

	write(50)
	if out, stderr, code := run(t, nil, append([]string{"migrate", "--force"}, flags...)...); code != 0 || !strings.Contains(out, "applied migration(s) [18 ") {
		t.Fatalf("migrate --force: exit %d, %q %q", code, out, stderr)
	}
	write(50)
	await.Eventually(t, time.Minute, func() error {
		if st := statusJSONOf(t, flags); st.Backlog != 0 {
			return fmt.Errorf("backlog %d: the relay of this release has not published everything", st.Backlog)
		}
		return nil
	})
	// The relay of this release records its version at its next
	// heartbeat after the migration; the other stays behind.
	await.Eventually(t, time.Minute, func() error {
		text, stderr, code := run(t, nil, append([]string{"status"}, flags...)...)
		if code != 0 {
			return fmt.Errorf("status: %s", stderr)
		}
		for _, want := range []string{fmt.Sprintf("relays from               schema version %d", pgschema.RelaysFrom(pgschema.Latest())),
			"relay behind the table    old-relay (schema version unknown (an older release)): it cannot tell, and may skip rows"} {
			if !strings.Contains(text, want) {
				return fmt.Errorf("status does not say %q:\n%s", want, text)
			}
		}
		if n := strings.Count(text, "relay behind the table"); n != 1 {
			return fmt.Errorf("status lists %d relays behind the table; want old-relay only:\n%s", n, text)
		}
		if st := statusJSONOf(t, flags); st.RelaysFrom != pgschema.RelaysFrom(pgschema.Latest()) || len(st.RelaysBehind) != 1 || st.RelaysBehind[0].Name != "old-relay" {
			return fmt.Errorf("status --json: relays_from %d, relays_behind %+v; want old-relay", st.RelaysFrom, st.RelaysBehind)
		}
		return nil
	})
}

// statusOf is the part of `outbox status --json` the upgrade tests read.
type statusOf struct {
	Backlog       int64 `json:"backlog"`
	SchemaVersion int   `json:"schema_version"`
	RelaysFrom    int   `json:"relays_from"`
	RelaysBehind  []struct {
		Name string `json:"name"`
	} `json:"relays_behind"`
}

func statusJSONOf(t *testing.T, flags []string) statusOf {
	t.Helper()
	out, stderr, code := run(t, nil, append([]string{"status", "--json"}, flags...)...)
	var st statusOf
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status --json: exit %d, %q %q", code, out, stderr)
	}
	return st
}

// Log-tailing relays count among the live relays by their slot's lease:
// a streamer of a release before schema version 25 (it leases the slot
// without recording a version) makes `outbox migrate` refuse a migration
// that needs newer relays, listed and named with its slot; once its lease
// expired the migration goes through, and a streamer of this release is
// listed with the version, release and renewal it records.
func TestMigrateListsAndRefusesLogTailingRelays(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	flags := []string{"--db", dbURL(), "--schema", tb.Schema, "--table", tb.Name}
	if _, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	if _, stderr, code := run(t, nil, append([]string{"migrate", "--down", "17"}, flags...)...); code != 0 {
		t.Fatalf("migrate --down 17: %s", stderr)
	}
	// No replication slot is made: the lease's row is what migrate reads.
	slot := "s_" + testenv.Hex(t)
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("_cdc")+` (slot, publication, owner, epoch, expires_at)
VALUES ($1, $1, 'old-streamer', 1, clock_timestamp() + interval '10 minutes')`, slot); err != nil {
		t.Fatal(err)
	}
	name := "old-streamer (log tailing, slot " + slot + ")"
	out, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...)
	if code == 0 {
		t.Fatalf("migrate with an older streamer alive succeeded: %s", out)
	}
	for _, want := range []string{"refusing to migrate", "018_partition_derived", name + " (schema version unknown"} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("stderr %q does not say %q", stderr, want)
		}
	}
	for _, want := range []string{"1 live relay(s)", name + ": schema version unknown (an older release), last renewed unknown"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stdout %q does not list %q", out, want)
		}
	}

	if _, err := pool.Exec(ctx, `UPDATE `+tb.Qualified("_cdc")+` SET expires_at = clock_timestamp() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if out, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...); code != 0 || !strings.Contains(out, "0 live relay(s)") {
		t.Fatalf("migrate once the streamer's lease expired: exit %d, %q %q", code, out, stderr)
	}
	// What a streamer of this release records when it takes the lease.
	if _, err := pool.Exec(ctx, `UPDATE `+tb.Qualified("_cdc")+` SET owner = 'new-streamer', epoch = 2,
expires_at = clock_timestamp() + interval '10 minutes', schema_version = $1, release = 'v9.9.9',
leased_at = clock_timestamp(), renewed_at = timestamptz '2026-01-02 03:04:05Z', recorded_epoch = 2`, pgschema.Latest()); err != nil {
		t.Fatal(err)
	}
	out, stderr, code = run(t, nil, append([]string{"migrate"}, flags...)...)
	want := fmt.Sprintf("new-streamer (log tailing, slot %s): schema version %d, release v9.9.9, last renewed 2026-01-02T03:04:05Z", slot, pgschema.Latest())
	if code != 0 || !strings.Contains(out, "1 live relay(s)") || !strings.Contains(out, want) {
		t.Fatalf("migrate with a streamer of this release: exit %d, stdout %q (want %q), stderr %q", code, out, want, stderr)
	}
	// A streamer of an earlier release takes the lease over as its acquire
	// does (a new epoch, nothing recorded): what the previous one recorded
	// is not its version.
	if _, err := pool.Exec(ctx, `UPDATE `+tb.Qualified("_cdc")+` SET owner = 'older-streamer', epoch = epoch + 1, updated_at = now()`); err != nil {
		t.Fatal(err)
	}
	out, _, _ = run(t, nil, append([]string{"migrate"}, flags...)...)
	if want := "older-streamer (log tailing, slot " + slot + "): schema version unknown (an older release), last renewed unknown"; !strings.Contains(out, want) {
		t.Fatalf("stdout %q does not list %q", out, want)
	}
}
