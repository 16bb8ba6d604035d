package pgschema

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/outboxdriver"
)

// What log tailing streams from (docs/cdc.md): the table's row in its _cdc
// companion, the publication of its inserts and the replication slot. Log
// tailing (package outboxpgx/cdc) makes them as it starts; SetupSlot makes
// them from a migration (outboxdriver.MigrateOptions.CDC), through plain
// SQL that any PostgreSQL client can send (docs/databases.md gives it).

var slotRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// DefaultSlot is the default replication slot (and publication) name of
// table t: "outbox_<schema>_<table>", lower-cased, with a hash of the
// names appended when that was needed to keep it unique (upper-case
// letters) or short enough (63 bytes).
func DefaultSlot(t outboxdriver.Table) string {
	t = t.WithDefaults()
	raw := "outbox_" + t.Schema + "_" + t.Name
	name := strings.ToLower(raw)
	if name == raw && len(name) <= 63 {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(t.String()))
	return fmt.Sprintf("%s_%08x", name[:min(len(name), 54)], h.Sum32())
}

// SlotNames returns the slot and publication of t, their defaults filled
// in (DefaultSlot; the publication is named as the slot), or an error for
// a name PostgreSQL or the quoting rules would not take.
func SlotNames(t outboxdriver.Table, slot, publication string) (string, string, error) {
	if slot == "" {
		slot = DefaultSlot(t)
	}
	if !slotRE.MatchString(slot) {
		return "", "", fmt.Errorf("replication slot name %q: use 1 to 63 lower-case letters, digits and underscores", slot)
	}
	if publication == "" {
		publication = slot
	}
	if err := outboxdriver.ValidateIdent("publication", publication); err != nil {
		return "", "", err
	}
	return slot, publication, nil
}

// EnsureCDCRowSQL makes t's _cdc row of a slot ($1) and its publication
// ($2) when missing, and records another publication.
func EnsureCDCRowSQL(t outboxdriver.Table) string {
	cdc := CDCNamesOf(t).State
	return `INSERT INTO ` + cdc + ` (slot, publication) VALUES ($1, $2)
ON CONFLICT (slot) DO UPDATE SET publication = excluded.publication WHERE ` + cdc + `.publication <> excluded.publication`
}

// SlotLookupSQL reads the replication slot $1: its plugin, whether it is
// of the current database, and its wal_status ("lost" once invalidated).
// No row: no such slot.
const SlotLookupSQL = `SELECT coalesce(plugin, ''), database = current_database(), coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_name = $1`

// queryRow runs sql on q and scans its one row into dest; found is false
// when it returned none.
func queryRow(ctx context.Context, q Tx, sql string, args []any, dest ...any) (found bool, err error) {
	err = q.Each(ctx, sql, args, func(scan func(dest ...any) error) error {
		found = true
		return scan(dest...)
	})
	return found, err
}

// EnsurePublication makes the publication of t's inserts (and truncates,
// which are logged) when it is missing (unless create is false: then that
// is an error saying what to run), and fails when it exists without the
// table. It reports whether it created or altered it.
func EnsurePublication(ctx context.Context, q Tx, t outboxdriver.Table, publication string, create bool) (changed bool, err error) {
	var exists, hasTable, truncates bool
	_, err = queryRow(ctx, q, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
       EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3),
       coalesce((SELECT pubtruncate FROM pg_publication WHERE pubname = $1), false)`,
		[]any{publication, t.Schema, t.Name}, &exists, &hasTable, &truncates)
	if err != nil {
		return false, fmt.Errorf("look up publication %s: %w", publication, err)
	}
	pub := outboxdriver.QuoteIdent(publication)
	switch {
	case exists && hasTable && !truncates && create:
		// Made before TRUNCATE was published: the relay logs a TRUNCATE of
		// the table it is told of.
		if err := q.Exec(ctx, `ALTER PUBLICATION `+pub+` SET (publish = 'insert, truncate')`); err != nil {
			return false, fmt.Errorf("publish TRUNCATE in publication %s: %w", publication, err)
		}
		return true, nil
	case exists && hasTable:
		return false, nil
	case exists:
		return false, fmt.Errorf("publication %s does not publish %s: run ALTER PUBLICATION %s ADD TABLE %s, or name another publication",
			publication, t, pub, t.Qualified(""))
	case !create:
		return false, fmt.Errorf("publication %s does not exist: run CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert, truncate'), or let the relay create it",
			publication, pub, t.Qualified(""))
	}
	err = q.Exec(ctx, `CREATE PUBLICATION `+pub+` FOR TABLE `+t.Qualified("")+` WITH (publish = 'insert, truncate')`)
	if sqlState(err) == "42710" {
		return false, nil // made meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("create publication %s: %w", publication, err)
	}
	return true, nil
}

// SetupSlot makes, when missing, what log tailing of t streams from: t's
// _cdc row of slot, the publication and the replication slot, which it
// records as made (a relay that later finds it missing knows it lost it).
// Each statement commits on its own: q must not be a transaction that has
// written (PostgreSQL makes no slot in one). A slot t had and lost
// (dropped, or invalidated by max_slot_wal_keep_size) is an error, not
// made again: writers in message or insert + delete mode lost what they
// wrote meanwhile, which a new slot would hide (a relay in table mode
// makes it again itself, and relays the rows still in the table first).
// It reports whether it created the slot.
func SetupSlot(ctx context.Context, q Tx, t outboxdriver.Table, slot, publication string) (created bool, err error) {
	t = t.WithDefaults()
	if slot, publication, err = SlotNames(t, slot, publication); err != nil {
		return false, err
	}
	if err := q.Exec(ctx, EnsureCDCRowSQL(t), slot, publication); err != nil {
		if sqlState(err) == "42P01" {
			return false, fmt.Errorf("%w: %s is not migrated for log tailing: run `outbox migrate`", outboxdriver.ErrNotMigrated, t)
		}
		return false, fmt.Errorf("record slot %s of %s: %w", slot, t, err)
	}
	if _, err := EnsurePublication(ctx, q, t, publication, true); err != nil {
		return false, err
	}
	var plugin, walStatus string
	var sameDB, had bool
	found, err := queryRow(ctx, q, SlotLookupSQL, []any{slot}, &plugin, &sameDB, &walStatus)
	if err != nil {
		return false, fmt.Errorf("look up replication slot %s: %w", slot, err)
	}
	if _, err := queryRow(ctx, q, `SELECT slot_created FROM `+CDCNamesOf(t).State+` WHERE slot = $1`, []any{slot}, &had); err != nil {
		return false, fmt.Errorf("read the state of slot %s: %w", slot, err)
	}
	switch {
	case found && (plugin != "pgoutput" || !sameDB):
		return false, fmt.Errorf("replication slot %s exists but is not a pgoutput slot of this database: name another slot", slot)
	case found && walStatus != "lost":
		if !had {
			return false, markSlot(ctx, q, t, slot)
		}
		return false, nil
	case found || had:
		return false, fmt.Errorf("replication slot %s of %s was lost (dropped, or invalidated by max_slot_wal_keep_size): events written in message or insert + delete mode since may not have been relayed, so it is not made again here; "+
			"a relay with log tailing in table mode makes it again, and says what was lost in the other modes (docs/cdc.md)", slot, t)
	}
	err = q.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	switch {
	case sqlState(err) == "42710":
		// Made meanwhile, by a relay or another migration.
	case err != nil:
		return false, fmt.Errorf("create replication slot %s: %w", slot, SlotError(err, slot))
	default:
		created = true
	}
	return created, markSlot(ctx, q, t, slot)
}

// markSlot records that slot exists, and that its first streamer relays
// the rows already in the table (which the slot does not hold) before its
// stream: some may be published twice, none is lost.
func markSlot(ctx context.Context, q Tx, t outboxdriver.Table, slot string) error {
	err := q.Exec(ctx, `UPDATE `+CDCNamesOf(t).State+` SET slot_created = true, drained = false, confirmed_lsn = NULL, drain_lsn = NULL
WHERE slot = $1 AND NOT slot_created`, slot)
	if err != nil {
		return fmt.Errorf("record replication slot %s as made: %w", slot, err)
	}
	return nil
}

// sqlState is the SQLSTATE of err as pgx (and its database/sql driver) or
// lib/pq report it, or "".
func sqlState(err error) string {
	if err == nil {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState()
	}
	return ""
}

// SlotError says what to do about the common failures of slot commands.
func SlotError(err error, slot string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == "55000" && strings.Contains(pgErr.Message, "wal_level"):
		return fmt.Errorf("log tailing needs wal_level = logical: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL (%s)", pgErr.Message)
	case pgErr.Code == "42501":
		return fmt.Errorf("the relay's role may not replicate: run ALTER ROLE <the relay's role> REPLICATION (%s)", pgErr.Message)
	case pgErr.Code == "53400":
		return fmt.Errorf("no replication slot is free: raise max_replication_slots, or drop an unused slot (%s)", pgErr.Message)
	case pgErr.Code == "55006":
		return fmt.Errorf("replication slot %s is busy: another process streams from it (%s)", slot, pgErr.Message)
	}
	return err
}

// ErrSlotInTx is the refusal of MigrateOptions.CDC by MigrateTx.
var ErrSlotInTx = errors.New("MigrateOptions.CDC needs Migrate, not MigrateTx: PostgreSQL makes no replication slot in a transaction that has written; " +
	"make it after the commit (Migrate, `outbox migrate --cdc`, or SELECT pg_create_logical_replication_slot, docs/databases.md)")

// MigrateSlot makes the slot of t once a migration with opts (nil: none)
// committed, when opts asks for it (CDC) or the migrating driver writes in
// a mode without rows (rowless), whose writers need it (SetupSlot).
func MigrateSlot(ctx context.Context, q Tx, t outboxdriver.Table, opts *outboxdriver.MigrateOptions, rowless bool) error {
	var o outboxdriver.MigrateOptions
	if opts != nil {
		o = *opts
	}
	if !o.CDC && !rowless {
		return nil
	}
	_, err := SetupSlot(ctx, q, t, o.CDCSlot, o.CDCPublication)
	return err
}
