package pgschema

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

// RelayVersionsSince is the schema version whose migration records each
// relay's schema version, release and renewal in the relays registry, and
// each applied migration's relays_from (docs/operations.md, Upgrades).
const RelayVersionsSince = 20

// RelaysFrom is the oldest relay schema version that works with a table
// at version v of this build's migrations (0: every relay).
func RelaysFrom(v int) int {
	done := map[int]bool{}
	for i := 1; i <= v; i++ {
		done[i] = true
	}
	return migrations.RelaysFrom(all(), done)
}

// RelaysSQL lists the relays of t's registry, alive or not yet cleaned up:
// name, started, seconds until the registration expires, schema version
// (0: unknown), release and last renewal (NULL: unknown). withVersions
// says whether the registry has the columns of RelayVersionsSince.
func RelaysSQL(t outboxdriver.Table, withVersions bool) string {
	cols := `0, '', NULL::timestamptz`
	if withVersions {
		cols = `coalesce(schema_version, 0), release, renewed_at`
	}
	return `SELECT relay, started_at, extract(epoch FROM expires_at - clock_timestamp())::float8, ` + cols +
		` FROM ` + NamesOf(t).Relays + ` ORDER BY relay`
}

// ScanRelay reads a row of RelaysSQL.
func ScanRelay(scan func(dest ...any) error) (outboxdriver.RelayStatus, error) {
	var r outboxdriver.RelayStatus
	var secs float64
	var renewed *time.Time
	if err := scan(&r.Name, &r.Started, &secs, &r.SchemaVersion, &r.Release, &renewed); err != nil {
		return r, err
	}
	r.ExpiresIn = time.Duration(secs * float64(time.Second))
	if renewed != nil {
		r.RenewedAt = *renewed
	}
	return r, nil
}

// LiveRelays lists the relays of t whose registration has not expired,
// inside tx: none when the table has no registry yet.
func LiveRelays(ctx context.Context, tx Tx, t outboxdriver.Table) ([]outboxdriver.RelayStatus, error) {
	n := NamesOf(t)
	has, err := tx.Versions(ctx, `SELECT 1 WHERE to_regclass($1) IS NOT NULL`, n.Relays)
	if err != nil || len(has) == 0 {
		return nil, err
	}
	cols, err := tx.Versions(ctx, `SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'schema_version' AND NOT attisdropped`, n.Relays)
	if err != nil {
		return nil, err
	}
	var out []outboxdriver.RelayStatus
	err = tx.Each(ctx, RelaysSQL(t, len(cols) > 0), nil, func(scan func(...any) error) error {
		r, err := ScanRelay(scan)
		if err == nil && r.ExpiresIn > 0 {
			out = append(out, r)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the relays of %s: %w", t, err)
	}
	return out, nil
}

// refuseRelaysBehind returns a *outboxdriver.RelaysBehindError when a
// migration of ms that done lacks needs newer relays than a live relay of
// t runs with.
func refuseRelaysBehind(ctx context.Context, tx Tx, t outboxdriver.Table, ms []migrations.Migration, done map[int]bool) error {
	relays, err := LiveRelays(ctx, tx, t)
	if err != nil {
		return err
	}
	if err := migrations.Behind(ms, done, relays); err != nil {
		if e, ok := err.(*outboxdriver.RelaysBehindError); ok {
			e.Table = t
		}
		return err
	}
	return nil
}

// recordRelaysFrom writes every applied migration's relays_from, once the
// bookkeeping table has the column: the migrations of ms that ran before
// RelayVersionsSince did not record theirs.
func recordRelaysFrom(ctx context.Context, tx Tx, t outboxdriver.Table, ms []migrations.Migration) error {
	for _, m := range ms {
		if m.RelaysFrom == 0 || m.Version >= RelayVersionsSince {
			continue
		}
		if err := tx.Exec(ctx, `UPDATE `+NamesOf(t).Migrations+` SET relays_from = $2 WHERE version = $1`, m.Version, m.RelaysFrom); err != nil {
			return fmt.Errorf("record the relays migration %d works with: %w", m.Version, err)
		}
	}
	return nil
}

// CheckSchemaSQL reads t's schema version and the oldest relay schema
// version it works with; t must be at RelayVersionsSince or later for the
// second (the caller reads the version first, with SchemaVersionSQL).
func CheckSchemaSQL(t outboxdriver.Table) string {
	return `SELECT coalesce(max(version), 0), coalesce(max(relays_from), 0) FROM ` + NamesOf(t).Migrations
}
