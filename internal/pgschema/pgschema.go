// Package pgschema holds the PostgreSQL schema of the outbox: embedded,
// numbered migrations rendered for a validated schema and table name, and
// the runner both PostgreSQL drivers share. It also holds, once, what the
// pgx driver (package outboxpgx) and log tailing (package outboxpgx/cdc)
// both use: the format of events written as logical decoding messages,
// the names of the log-tailing companions and the replication slots'
// status, and the statements and arguments both sources run.
package pgschema

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

//go:embed migrations/*.sql
var files embed.FS

// all reads the embedded migrations once per call; they are small.
func all() []migrations.Migration { return migrations.MustLoad(files, "migrations") }

// Latest is the newest schema version.
func Latest() int { return migrations.Latest(all()) }

// QuoteLiteral quotes s as an SQL string literal.
func QuoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// NamesOf returns the qualified, quoted names of t's tables.
func NamesOf(t outboxdriver.Table) driverkit.Names {
	return driverkit.NamesOf(t.Qualified)
}

// MigratedSQL reads one boolean: whether the outbox table and the
// migrations table of MigratedArgs(t) exist.
const MigratedSQL = `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`

// MigratedArgs are MigratedSQL's arguments for t.
func MigratedArgs(t outboxdriver.Table) []any {
	n := NamesOf(t.WithDefaults())
	return []any{n.Table, n.Migrations}
}

// PartitionOf returns the SQL of the partition of the outbox row that
// alias names (with its dot, or "" for none): its aggregate id's hash over
// the table's partitions, one lease each, fixed when the table was made.
// Relays compute it (schema version 18 no longer stores it); it is the value
// the column held in versions 2 to 17, so a relay using it works on those
// too, and nothing a writer puts into the row can change it.
func PartitionOf(alias string, t outboxdriver.Table) string {
	return `((hashtextextended(` + alias + `aggregateid, 0) & 9223372036854775807) % (SELECT count(*) FROM ` + NamesOf(t).Leases + `))::integer`
}

// Options shape what a migration creates.
type Options = outboxdriver.MigrateOptions

// Render replaces the {{...}} placeholders of a migration with t's quoted
// names. t must be valid.
func Render(sql string, t outboxdriver.Table, o Options) string {
	n, c := NamesOf(t), CDCNamesOf(t)
	q := outboxdriver.QuoteIdent
	idKey, partitioning := "PRIMARY KEY", ""
	if o.TimePartitions != "" {
		idKey, partitioning = "NOT NULL", " PARTITION BY RANGE (created_at)"
	}
	return strings.NewReplacer(
		"{{id_key}}", idKey,
		"{{time_partitioning}}", partitioning,
		"{{time_parts}}", t.Qualified(timePartsSuffix),
		"{{time_parts_fn}}", t.Qualified(timePartsFnSuffix),
		"{{time_parts_default}}", t.Qualified(DefaultPartitionSuffix),
		"{{time_parts_default_name}}", QuoteLiteral(t.Name+DefaultPartitionSuffix),
		"{{time_parts_lock}}", QuoteLiteral("outbox.time-partitions:"+t.String()),
		"{{table_name_literal}}", QuoteLiteral(t.Name),
		"{{schema_name_literal}}", QuoteLiteral(t.Schema),
		"{{schema}}", q(t.Schema),
		"{{table}}", n.Table,
		"{{table_literal}}", QuoteLiteral(n.Table),
		"{{dead_letter}}", n.DeadLetter,
		"{{wakeup}}", n.Wakeup,
		"{{awake}}", t.Qualified("_awake"),
		"{{awake_literal}}", QuoteLiteral(t.Qualified("_awake")),
		"{{awake_fn}}", t.Qualified("_awake_set"),
		"{{awake_trg}}", q(t.Name+"_awake"),
		"{{awake_lock}}", QuoteLiteral("outbox.awake:"+t.String()),
		"{{leases}}", n.Leases,
		"{{relays}}", n.Relays,
		"{{migrations}}", n.Migrations,
		"{{held}}", n.Held,
		"{{audit}}", n.Audit,
		"{{pause}}", t.Qualified("_pause"),
		"{{masking}}", t.Qualified("_masking"),
		"{{samples}}", t.Qualified("_samples"),
		"{{pending_idx}}", q(t.Name+"_pending"),
		"{{id_idx_q_literal}}", QuoteLiteral(t.Qualified("_id")),
		"{{by_part_idx}}", q(t.Name+"_by_part"),
		"{{by_part_idx_q}}", t.Qualified("_by_part"),
		"{{waiting_idx}}", q(t.Name+"_waiting"),
		"{{waiting_idx_q}}", t.Qualified("_waiting"),
		"{{published_idx}}", q(t.Name+"_published"),
		"{{published_idx_q}}", t.Qualified("_published"),
		"{{held_event_idx}}", q(t.Name+"_held_event"),
		"{{dead_letter_at_idx}}", q(t.Name+"_dead_letter_at"),
		"{{dead_letter_at_idx_q}}", t.Qualified("_dead_letter_at"),
		"{{fence_fn}}", t.Qualified("_fence"),
		"{{notify_fn}}", t.Qualified("_notify"),
		"{{notify_trg}}", q(t.Name+"_notify"),
		"{{partition_fn}}", t.Qualified("_partition"),
		"{{partition_trg}}", q(t.Name+"_partition"),
		"{{cdc}}", c.State,
		"{{cdc_fence_fn}}", c.Fence,
		"{{cdc_write_fn}}", c.Write,
		"{{cdc_emit_fn}}", c.Emit,
		"{{cdc_slot_fn}}", c.Slot,
		"{{message_prefix}}", QuoteLiteral(MessagePrefix(t)),
		"{{cdc_mark_fn}}", c.Mark,
		"{{cdc_drain}}", c.Drain,
		"{{cdc_parked}}", c.Parked,
		"{{requests}}", t.Qualified("_requests"),
		"{{requests_idx}}", q(t.Name+"_requests_at"),
		"{{audit_guard_fn}}", t.Qualified("_audit_ro"),
		"{{audit_guard_trg}}", q(t.Name+"_audit_ro"),
		"{{audit_guard_trunc_trg}}", q(t.Name+"_audit_rot"),
		"{{audit_prune_fn}}", t.Qualified("_audit_prune"),
		"{{audit_prune_sig}}", QuoteLiteral(t.Qualified("_audit_prune")+"(timestamptz, text, text, text)"),
		"{{audit_literal}}", QuoteLiteral(n.Audit),
		"{{audit_at_idx}}", q(t.Name+"_audit_at"),
		"{{audit_at_idx_q}}", t.Qualified("_audit_at"),
		"{{dl_group_idx}}", q(t.Name+"_dl_group"),
		"{{dl_group_idx_q}}", t.Qualified("_dl_group"),
		"{{dl_aggtype_idx}}", q(t.Name+"_dl_aggtype"),
		"{{dl_aggtype_idx_q}}", t.Qualified("_dl_aggtype"),
		"{{dl_type_idx}}", q(t.Name+"_dl_type"),
		"{{dl_type_idx_q}}", t.Qualified("_dl_type"),
		"{{dl_aggid_idx}}", q(t.Name+"_dl_aggid"),
		"{{dl_aggid_idx_q}}", t.Qualified("_dl_aggid"),
		"{{audit_event_idx}}", q(t.Name+"_audit_event"),
		"{{audit_event_idx_q}}", t.Qualified("_audit_event"),
		"{{audit_request_idx}}", q(t.Name+"_audit_request"),
		"{{audit_request_idx_q}}", t.Qualified("_audit_request"),
		"{{audit_action_idx}}", q(t.Name+"_audit_action"),
		"{{audit_action_idx_q}}", t.Qualified("_audit_action"),
		"{{audit_actor_idx}}", q(t.Name+"_audit_actor"),
		"{{audit_actor_idx_q}}", t.Qualified("_audit_actor"),
		"{{channel}}", QuoteLiteral(t.Channel()),
		"{{partitions}}", strconv.Itoa(o.Partitions),
	).Replace(sql)
}

// Tx is the part of a database transaction the runner needs.
type Tx = migrations.Tx

// lock serialises concurrent migrations of one table.
func lock(ctx context.Context, tx Tx, t outboxdriver.Table) error {
	return tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "outbox.migrate:"+t.String())
}

// prepare validates t, takes the migration lock and returns the applied
// versions.
func prepare(ctx context.Context, tx Tx, t outboxdriver.Table) (map[int]bool, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if err := lock(ctx, tx, t); err != nil {
		return nil, err
	}
	return applied(ctx, tx, t)
}

// applied creates the bookkeeping table if needed and returns the applied
// versions.
func applied(ctx context.Context, tx Tx, t outboxdriver.Table) (map[int]bool, error) {
	n := NamesOf(t)
	// Only when missing: CREATE SCHEMA IF NOT EXISTS needs the CREATE right
	// on the database even when the schema exists, which a role that owns
	// the tables need not have (docs/security.md).
	found, err := tx.Versions(ctx, `SELECT 1 FROM pg_namespace WHERE nspname = $1`, t.Schema)
	if err != nil {
		return nil, fmt.Errorf("look up schema %s: %w", t.Schema, err)
	}
	if len(found) == 0 {
		if err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+outboxdriver.QuoteIdent(t.Schema)); err != nil {
			return nil, fmt.Errorf("create schema %s: %w", t.Schema, err)
		}
	}
	if err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+n.Migrations+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create migrations table: %w", err)
	}
	vs, err := tx.Versions(ctx, `SELECT version FROM `+n.Migrations)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	done := map[int]bool{}
	for _, v := range vs {
		done[v] = true
	}
	return done, nil
}

// Up applies, inside tx, every migration not yet applied to t and returns
// the versions it applied (none on a second run). The caller commits.
// Options matter only for the migrations that run now.
func Up(ctx context.Context, tx Tx, t outboxdriver.Table, o Options) ([]int, error) {
	o, err := driverkit.ResolveMigrate(&o)
	if err != nil {
		return nil, err
	}
	done, err := prepare(ctx, tx, t)
	if err != nil {
		return nil, err
	}
	ms := all()
	if !o.IgnoreRelaysBehind {
		if err := refuseRelaysBehind(ctx, tx, t, ms, done); err != nil {
			return nil, err
		}
	}
	ran, err := migrations.Up(ms, done, func(m migrations.Migration) error {
		if err := tx.Exec(ctx, Render(m.Up, t, o)); err != nil {
			return fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
		}
		record, args := `INSERT INTO `+NamesOf(t).Migrations+` (version, name) VALUES ($1, $2)`, []any{m.Version, m.Name}
		if m.Version >= RelayVersionsSince {
			record, args = `INSERT INTO `+NamesOf(t).Migrations+` (version, name, relays_from) VALUES ($1, $2, $3)`, append(args, m.RelaysFrom)
		}
		if err := tx.Exec(ctx, record, args...); err != nil {
			return fmt.Errorf("record migration %d: %w", m.Version, err)
		}
		if m.Version == RelayVersionsSince {
			return recordRelaysFrom(ctx, tx, t, ms)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if o.TimePartitions != "" {
		if err := setUpTimePartitions(ctx, tx, t, o); err != nil {
			return nil, err
		}
	}
	wakeups := o.Wakeups
	if wakeups == "" && slices.Contains(ran, 1) {
		// A new table: its writers wake the relay (schema version 26's
		// default; docs/relay.md, wake-ups). An existing table keeps
		// what it has.
		wakeups = outboxdriver.WakeupsWriters
	}
	if err := SetWakeups(ctx, tx, t, wakeups); err != nil {
		return nil, err
	}
	return ran, nil
}

// Down reverts, inside tx, every applied migration newer than target (0
// removes everything) and returns the versions it reverted, newest first.
func Down(ctx context.Context, tx Tx, t outboxdriver.Table, target int) ([]int, error) {
	done, err := prepare(ctx, tx, t)
	if err != nil {
		return nil, err
	}
	if err := refuseDownBelowTimeParts(ctx, tx, t, target); err != nil {
		return nil, err
	}
	ran, err := migrations.Down(all(), done, target, func(m migrations.Migration) error {
		if err := tx.Exec(ctx, Render(m.Down, t, Options{})); err != nil {
			return fmt.Errorf("revert migration %03d_%s: %w", m.Version, m.Name, err)
		}
		return tx.Exec(ctx, `DELETE FROM `+NamesOf(t).Migrations+` WHERE version = $1`, m.Version)
	})
	if err != nil {
		return nil, err
	}
	if target == 0 {
		if err := tx.Exec(ctx, `DROP TABLE `+NamesOf(t).Migrations); err != nil {
			return nil, err
		}
	}
	return ran, nil
}
