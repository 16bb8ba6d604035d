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

// CDCVersionsSince is the schema version whose migration records, in the
// _cdc companion, the schema version, release, lease and renewal times of
// each slot's streamer (docs/operations.md, Upgrades).
const CDCVersionsSince = 25

// StreamersSQL lists the streamers of t's replication slots that hold or
// held a lease, as rows of RelaysSQL (ScanRelay reads them): named for
// their owner and slot, the version, release and renewal those of this
// release and later record with the lease (read through the row's JSON,
// so that the statement works before CDCVersionsSince too, where they are
// unknown), and unknown when the lease was taken without recording them (a
// streamer of an earlier release).
func StreamersSQL(t outboxdriver.Table) string {
	return `SELECT c.owner || ' (log tailing, slot ' || c.slot || ')',
       CASE WHEN v.cur THEN coalesce(v.leased, c.updated_at) ELSE c.updated_at END,
       extract(epoch FROM c.expires_at - clock_timestamp())::float8,
       CASE WHEN v.cur THEN coalesce(v.version, 0) ELSE 0 END,
       CASE WHEN v.cur THEN coalesce(v.release, '') ELSE '' END,
       CASE WHEN v.cur THEN v.renewed END
FROM ` + CDCNamesOf(t).State + ` c
CROSS JOIN LATERAL (SELECT (j->>'recorded_epoch')::bigint IS NOT DISTINCT FROM c.epoch AS cur,
                           (j->>'schema_version')::int AS version, j->>'release' AS release,
                           (j->>'leased_at')::timestamptz AS leased, (j->>'renewed_at')::timestamptz AS renewed
                    FROM (SELECT to_jsonb(c) AS j) r) v
WHERE c.owner IS NOT NULL AND isfinite(c.expires_at)
ORDER BY c.slot`
}

// Streamers lists, inside tx, the streamers of t's replication slots that
// hold or held a lease (StreamersSQL): none when t has no _cdc companion.
func Streamers(ctx context.Context, tx Tx, t outboxdriver.Table) ([]outboxdriver.RelayStatus, error) {
	has, err := tx.Versions(ctx, `SELECT 1 WHERE to_regclass($1) IS NOT NULL`, CDCNamesOf(t).State)
	if err != nil || len(has) == 0 {
		return nil, err
	}
	var out []outboxdriver.RelayStatus
	err = tx.Each(ctx, StreamersSQL(t), nil, func(scan func(...any) error) error {
		r, err := ScanRelay(scan)
		if err == nil {
			out = append(out, r)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the streamers of %s: %w", t, err)
	}
	return out, nil
}

// LiveRelays lists the relays of t whose registration has not expired and
// the streamers of its replication slots whose lease has not (Streamers),
// inside tx: none when the table has no registry yet.
func LiveRelays(ctx context.Context, tx Tx, t outboxdriver.Table) ([]outboxdriver.RelayStatus, error) {
	n := NamesOf(t)
	has, err := tx.Versions(ctx, `SELECT 1 WHERE to_regclass($1) IS NOT NULL`, n.Relays)
	if err != nil || len(has) == 0 {
		return nil, err
	}
	streamers, err := Streamers(ctx, tx, t)
	if err != nil {
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
	for _, r := range streamers {
		if r.ExpiresIn > 0 {
			out = append(out, r)
		}
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
// second (CheckSchema reads the version first).
func CheckSchemaSQL(t outboxdriver.Table) string {
	return `SELECT coalesce(max(version), 0), coalesce(max(relays_from), 0) FROM ` + NamesOf(t).Migrations
}

// QueryRow runs sql with args and scans its one row into dest: a pool's or
// a transaction's, for the functions here that read without a Tx.
type QueryRow func(ctx context.Context, sql string, args []any, dest ...any) error

// CheckSchema reads t's schema version and the oldest relay schema
// version it works with, for a relay whose code knows schema version
// latest (outboxdriver.SchemaChecker): the polling source and the
// log-tailing one both ask through it. A table of a newer release records
// the latter with every migration; a table not migrated reads as version 0.
func CheckSchema(ctx context.Context, row QueryRow, t outboxdriver.Table, latest int) (outboxdriver.SchemaCheck, error) {
	c := outboxdriver.SchemaCheck{RelayVersion: latest}
	t = t.WithDefaults()
	var ok bool
	if err := row(ctx, MigratedSQL, MigratedArgs(t), &ok); err != nil {
		return c, fmt.Errorf("read the schema version of %s: %w", t, err)
	}
	if !ok {
		return c, nil
	}
	if err := row(ctx, `SELECT coalesce(max(version), 0) FROM `+NamesOf(t).Migrations, nil, &c.TableVersion); err != nil {
		return c, fmt.Errorf("read the schema version of %s: %w", t, err)
	}
	if c.TableVersion < RelayVersionsSince {
		c.RelaysFrom = RelaysFrom(c.TableVersion)
		return c, nil
	}
	if err := row(ctx, CheckSchemaSQL(t), nil, &c.TableVersion, &c.RelaysFrom); err != nil {
		return c, fmt.Errorf("read the schema version of %s: %w", t, err)
	}
	return c, nil
}
