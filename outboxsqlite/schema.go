package outboxsqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

//go:embed migrations/*.sql
var files embed.FS

// all reads the embedded migrations; they are small.
func all() []migrations.Migration { return migrations.MustLoad(files, "migrations") }

// LatestVersion is the newest schema version this driver knows.
func (d *Driver) LatestVersion() int { return migrations.Latest(all()) }

// delayedVersion is the schema version that adds the deliver_at column.
const delayedVersion = 3

// nowSQL is the database clock in the format of every time column.
const nowSQL = `strftime('%Y-%m-%d %H:%M:%f', 'now')`

// nowPlusSQL is the database clock plus the milliseconds of parameter ?n.
func nowPlusSQL(n int) string {
	return fmt.Sprintf(`strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.3f seconds', ?%d / 1000.0))`, n)
}

// timeLayout parses the time columns (always UTC).
const timeLayout = "2006-01-02 15:04:05.999"

// timeFormat writes a time column as nowSQL does, to the millisecond, so
// that the columns compare as text.
const timeFormat = "2006-01-02 15:04:05.000"

// table checks t and fills in the defaults: schema "main", table "outbox".
// The "temp" schema is refused: a table there is private to one
// connection, and the relay would never see its events.
func table(t outboxdriver.Table) (outboxdriver.Table, error) {
	if t.Schema == "" {
		t.Schema = Schema
	}
	if t.Name == "" {
		t.Name = outboxdriver.DefaultTableName
	}
	if err := t.Validate(); err != nil {
		return t, fmt.Errorf("outboxsqlite: %w", err)
	}
	if strings.EqualFold(t.Schema, "temp") {
		return t, fmt.Errorf("outboxsqlite: schema %q: a temp table is private to one connection; use %q or an attached database", t.Schema, Schema)
	}
	return t, nil
}

func namesOf(t outboxdriver.Table) driverkit.Names { return driverkit.NamesOf(t.Qualified) }

// The partition hash (see the trigger in the first migration): the
// weighted sum of the code points of the first hashChars characters of
// the aggregate id and of its length, modulo hashMod, mixed (times
// hashMix modulo hashMod, without the low 8 bits, so that sequential ids
// spread), modulo the partition count. Every product of a code point (below 2^21) and a weight (below
// 2^31) stays below 2^52, and the sum of hashChars of them below 2^62, so
// SQLite's integer sum never overflows. Ids that differ only after
// hashChars characters share a partition: that costs spread, never order.
const (
	hashChars    = 1024
	hashMod      = 2147483647 // 2^31-1, a prime
	lengthWeight = 1000003
	hashMix      = 40503
)

// weightSQL is the weight of character position n (from 1), as SQL.
const weightSQL = `((n * 2654435761 + 40503) % 2147483647) | 1`

// weight is weightSQL in Go.
func weight(pos int64) int64 { return ((pos*2654435761 + 40503) % hashMod) | 1 }

// partitionOf computes in Go what the trigger computes in the database,
// for valid UTF-8 ids.
func partitionOf(aggregateID string, partitions int) int {
	h, pos := int64(0), int64(0)
	for _, r := range aggregateID {
		pos++
		if pos <= hashChars {
			h += weight(pos) * int64(r)
		}
	}
	h += pos * lengthWeight
	return int((h % hashMod * hashMix % hashMod >> 8) % int64(partitions))
}

// render replaces the {{...}} placeholders of a migration with t's quoted
// names. t must be valid.
func render(sql string, t outboxdriver.Table, partitions int) string {
	n := namesOf(t)
	q := outboxdriver.QuoteIdent
	return strings.NewReplacer(
		"{{table}}", n.Table,
		"{{table_name}}", q(t.Name),
		"{{dead_letter}}", n.DeadLetter,
		"{{leases}}", n.Leases,
		"{{relays}}", n.Relays,
		"{{migrations}}", n.Migrations,
		"{{held}}", n.Held,
		"{{held_name}}", q(t.Name+"_held"),
		"{{audit}}", n.Audit,
		"{{audit_name}}", q(t.Name+"_audit"),
		"{{dead_letter_name}}", q(t.Name+"_dead_letter"),
		"{{pause}}", t.Qualified("_pause"),
		"{{masking}}", t.Qualified("_masking"),
		"{{samples}}", t.Qualified("_samples"),
		"{{requests}}", t.Qualified("_requests"),
		"{{requests_name}}", q(t.Name+"_requests"),
		"{{requests_idx}}", t.Qualified("_requests_at"),
		"{{audit_prune}}", t.Qualified("_audit_prune"),
		"{{audit_prune_name}}", q(t.Name+"_audit_prune"),
		"{{audit_at_idx}}", t.Qualified("_audit_at"),
		"{{audit_request_idx}}", t.Qualified("_audit_req"),
		"{{dead_time_idx}}", t.Qualified("_dead_time"),
		"{{audit_upd}}", t.Qualified("_audit_upd"),
		"{{audit_del}}", t.Qualified("_audit_del"),
		"{{pending_idx}}", t.Qualified("_pending"),
		"{{by_part_idx}}", t.Qualified("_by_part"),
		"{{published_idx}}", t.Qualified("_published"),
		"{{waiting_idx}}", t.Qualified("_waiting"),
		"{{held_event_idx}}", t.Qualified("_held_event"),
		"{{hash}}", t.Qualified("_hash"),
		"{{hash_name}}", q(t.Name+"_hash"),
		"{{partition_trg}}", t.Qualified("_partition"),
		"{{hash_chars}}", strconv.Itoa(hashChars),
		"{{hash_mod}}", strconv.Itoa(hashMod),
		"{{length_weight}}", strconv.Itoa(lengthWeight),
		"{{mix}}", strconv.Itoa(hashMix),
		"{{weight_expr}}", weightSQL,
		"{{now}}", nowSQL,
		"{{partitions}}", strconv.Itoa(partitions),
	).Replace(sql)
}

// Migrate creates or upgrades the outbox table t and its companions (dead
// letters, leases, relays, held aggregates, audit, migration bookkeeping)
// in one transaction: SQLite's DDL is transactional, so a failed migration
// leaves nothing behind. It returns the versions it applied; a second run
// applies none. Concurrent migrators queue on the write lock, and the
// later ones find the work done. opts may be nil.
func (d *Driver) Migrate(ctx context.Context, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	return d.committed(ctx, t, func(tx *sql.Tx) ([]int, error) { return d.MigrateTx(ctx, tx, t, opts) })
}

// committed runs fn in a write transaction of the Driver's pool and
// commits it.
func (d *Driver) committed(ctx context.Context, t outboxdriver.Table, fn func(*sql.Tx) ([]int, error)) ([]int, error) {
	db, err := d.pool.Need()
	if err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: migrate %s: %s", t, oneLine(err))
	}
	defer tx.Rollback()
	vs, err := fn(tx)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outboxsqlite: migrate %s: commit: %s", t, oneLine(err))
	}
	return vs, nil
}

// MigrateTx is Migrate inside the caller's transaction tx, which the
// caller commits (SQLite's DDL is transactional: the outbox tables come
// into being with the rest of tx, or not at all).
func (d *Driver) MigrateTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	o, err := driverkit.ResolveMigrate(opts)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: %w", err)
	}
	if o.TimePartitions != "" {
		return nil, fmt.Errorf("outboxsqlite: %w", outboxdriver.ErrNoTimePartitions)
	}
	if o.Wakeups != "" {
		return nil, fmt.Errorf("outboxsqlite: %w", outboxdriver.ErrNoWakeups)
	}
	if o.CDC {
		return nil, fmt.Errorf("outboxsqlite: %w", outboxdriver.ErrNoCDC)
	}
	return inTx(ctx, tx, t, func(tx *sql.Tx, t outboxdriver.Table, done map[int]bool) ([]int, error) {
		ms := all()
		if !o.IgnoreRelaysBehind {
			relays, err := liveRelays(ctx, tx, t)
			if err != nil {
				return nil, err
			}
			if err := migrations.Behind(ms, done, relays); err != nil {
				if e, ok := err.(*outboxdriver.RelaysBehindError); ok {
					e.Table = t
				}
				return nil, fmt.Errorf("outboxsqlite: migrate %s: %w", t, err)
			}
		}
		mig := namesOf(t).Migrations
		ran, err := migrations.Up(ms, done, func(m migrations.Migration) error {
			if _, err := tx.ExecContext(ctx, render(m.Up, t, o.Partitions)); err != nil {
				return fmt.Errorf("migration %03d_%s: %s", m.Version, m.Name, oneLine(err))
			}
			record, args := `INSERT INTO `+mig+` (version, name) VALUES (?, ?)`, []any{m.Version, m.Name}
			if m.Version >= relayVersionsSince {
				record, args = `INSERT INTO `+mig+` (version, name, relays_from) VALUES (?, ?, ?)`, append(args, m.RelaysFrom)
			}
			if _, err := tx.ExecContext(ctx, record, args...); err != nil {
				return fmt.Errorf("record migration %d: %w", m.Version, err)
			}
			if m.Version == relayVersionsSince {
				for _, e := range ms {
					if e.RelaysFrom > 0 && e.Version < relayVersionsSince {
						if _, err := tx.ExecContext(ctx, `UPDATE `+mig+` SET relays_from = ? WHERE version = ?`, e.RelaysFrom, e.Version); err != nil {
							return fmt.Errorf("record the relays migration %d works with: %w", e.Version, err)
						}
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return ran, nil
	})
}

// relayVersionsSince is the schema version whose migration records each
// relay's schema version, release and renewal, and each applied
// migration's relays_from (docs/operations.md, Upgrades).
const relayVersionsSince = 4

// liveRelays lists the relays of t whose registration has not expired:
// none when the table has no registry yet.
func liveRelays(ctx context.Context, tx *sql.Tx, t outboxdriver.Table) ([]outboxdriver.RelayStatus, error) {
	n := namesOf(t)
	q := func(withVersions bool) string {
		cols := `0, '', NULL`
		if withVersions {
			cols = `coalesce(schema_version, 0), "release", renewed_at`
		}
		return `SELECT relay, (julianday(expires_at) - julianday('now')) * 86400.0, ` + cols + ` FROM ` + n.Relays + ` WHERE expires_at > ` + nowSQL + ` ORDER BY relay`
	}
	rows, err := tx.QueryContext(ctx, q(true))
	if err != nil && strings.Contains(err.Error(), "no such column") {
		rows, err = tx.QueryContext(ctx, q(false))
	}
	if err != nil && strings.Contains(err.Error(), "no such table") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: read the relays of %s: %s", t, oneLine(err))
	}
	defer rows.Close()
	var out []outboxdriver.RelayStatus
	for rows.Next() {
		var r outboxdriver.RelayStatus
		var renewed sql.NullString
		var secs float64
		if err := rows.Scan(&r.Name, &secs, &r.SchemaVersion, &r.Release, &renewed); err != nil {
			return nil, fmt.Errorf("outboxsqlite: read the relays of %s: %s", t, oneLine(err))
		}
		if renewed.Valid {
			r.RenewedAt, _ = time.Parse("2006-01-02 15:04:05.000", renewed.String)
		}
		r.ExpiresIn = time.Duration(secs * float64(time.Second))
		out = append(out, r)
	}
	return out, rows.Err()
}

// MigrateDown reverts the migrations of t newer than target in one
// transaction, newest first; target 0 removes the outbox tables and
// everything in them. It returns the versions it reverted.
func (d *Driver) MigrateDown(ctx context.Context, t outboxdriver.Table, target int) ([]int, error) {
	if target < 0 {
		return nil, fmt.Errorf("outboxsqlite: migrate down to %d: the target must be 0 or more", target)
	}
	return d.committed(ctx, t, func(tx *sql.Tx) ([]int, error) {
		return inTx(ctx, tx, t, func(tx *sql.Tx, t outboxdriver.Table, done map[int]bool) ([]int, error) {
			ran, err := migrations.Down(all(), done, target, func(m migrations.Migration) error {
				if _, err := tx.ExecContext(ctx, render(m.Down, t, 0)); err != nil {
					return fmt.Errorf("revert migration %03d_%s: %s", m.Version, m.Name, oneLine(err))
				}
				_, err := tx.ExecContext(ctx, `DELETE FROM `+namesOf(t).Migrations+` WHERE version = ?`, m.Version)
				return err
			})
			if err != nil {
				return nil, err
			}
			if target == 0 {
				if _, err := tx.ExecContext(ctx, `DROP TABLE `+namesOf(t).Migrations); err != nil {
					return nil, err
				}
			}
			return ran, nil
		})
	})
}

// inTx runs fn in tx, a write transaction (from Open's pool, BEGIN
// IMMEDIATE: it holds the write lock from the start, so concurrent
// migrators run one after the other), with the applied versions of t.
func inTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, fn func(*sql.Tx, outboxdriver.Table, map[int]bool) ([]int, error)) ([]int, error) {
	t, err := table(t)
	if err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, fmt.Errorf("outboxsqlite: migrate %s: transaction is nil", t)
	}
	n := namesOf(t)
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+n.Migrations+` (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT (`+nowSQL+`))`); err != nil {
		return nil, fmt.Errorf("outboxsqlite: migrate %s: create the migrations table: %s", t, oneLine(err))
	}
	rows, err := tx.QueryContext(ctx, `SELECT version FROM `+n.Migrations)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: migrate %s: read applied migrations: %s", t, oneLine(err))
	}
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outboxsqlite: migrate %s: %w", t, err)
		}
		done[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxsqlite: migrate %s: %w", t, err)
	}
	vs, err := fn(tx, t, done)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: migrate %s: %w", t, err)
	}
	return vs, nil
}
