package outboxdriver

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// longestSuffix is the longest suffix added to the table name to name the
// tables, indexes and functions that belong to it ("_dead_letter").
const longestSuffix = len("_dead_letter")

// MaxTableLen is the longest table name accepted: derived names such as
// <table>_dead_letter must still fit PostgreSQL's 63-byte identifiers.
const MaxTableLen = 63 - longestSuffix

// Table names the outbox table and the schema it lives in.
type Table struct {
	Schema string
	Name   string
}

// DefaultTable is public.outbox.
var DefaultTable = Table{Schema: "public", Name: "outbox"}

// ValidateIdent reports whether s is a safe SQL identifier: a letter or
// underscore, then up to 62 letters, digits or underscores. what names the
// setting in the error.
func ValidateIdent(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s must not be empty", what)
	}
	if !identRE.MatchString(s) {
		return fmt.Errorf("%s %q is not a valid identifier: use a letter or underscore, then letters, digits or underscores, at most 63 in all", what, s)
	}
	return nil
}

// Validate checks schema and table name.
func (t Table) Validate() error {
	if err := ValidateIdent("schema", t.Schema); err != nil {
		return err
	}
	if err := ValidateIdent("table", t.Name); err != nil {
		return err
	}
	if len(t.Name) > MaxTableLen {
		return fmt.Errorf("table %q is too long: at most %d characters, so that %s_dead_letter fits PostgreSQL's 63-byte names", t.Name, MaxTableLen, t.Name)
	}
	return nil
}

// WithDefaults fills an empty schema or name from DefaultTable.
func (t Table) WithDefaults() Table {
	if t.Schema == "" {
		t.Schema = DefaultTable.Schema
	}
	if t.Name == "" {
		t.Name = DefaultTable.Name
	}
	return t
}

// QuoteIdent quotes a validated identifier for SQL.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Qualified returns "schema"."name" for the table, or for the table's
// companion named name+suffix.
func (t Table) Qualified(suffix string) string {
	return QuoteIdent(t.Schema) + "." + QuoteIdent(t.Name+suffix)
}

// Channel is the LISTEN/NOTIFY channel of the table: "schema.name", or a
// hash of it when that would exceed PostgreSQL's 63-byte channel names.
func (t Table) Channel() string {
	ch := t.Schema + "." + t.Name
	if len(ch) <= 63 {
		return ch
	}
	h := fnv.New64a()
	h.Write([]byte(ch))
	return fmt.Sprintf("outbox_%016x", h.Sum64())
}

// String returns schema.name.
func (t Table) String() string { return t.Schema + "." + t.Name }

// MigrateOptions shape what a migration creates. They matter only for the
// migrations that run in that call.
type MigrateOptions struct {
	// Partitions is the fixed number of partitions aggregates hash into;
	// it bounds how many relays share a table. Defaults to 64, at most
	// 4096. Set when the table is first migrated.
	Partitions int
}
