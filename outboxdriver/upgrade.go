package outboxdriver

import (
	"context"
	"fmt"
	"strings"
)

// PendingMigration is a migration not yet applied that older relays cannot
// work with.
type PendingMigration struct {
	Version int
	Name    string
	// RelaysFrom is the oldest relay schema version that works with the
	// table once it ran.
	RelaysFrom int
}

// RelaysBehindError is returned by Migrate, before it applies anything,
// when a pending migration needs relays of a newer schema version than
// live relays of the table run with (a relay of unknown version counts as
// older). Replace those relays with the new release first, or migrate
// with MigrateOptions.IgnoreRelaysBehind (outbox migrate --force).
type RelaysBehindError struct {
	Table Table
	// Migrations are the pending migrations the relays cannot work with.
	Migrations []PendingMigration
	// Relays are the live relays too old for them.
	Relays []RelayStatus
}

func (e *RelaysBehindError) Error() string {
	var ms, rs []string
	for _, m := range e.Migrations {
		ms = append(ms, fmt.Sprintf("%03d_%s (needs relays of schema version %d or newer)", m.Version, m.Name, m.RelaysFrom))
	}
	for _, r := range e.Relays {
		rs = append(rs, fmt.Sprintf("%s (%s)", r.Name, DescribeRelayVersion(r)))
	}
	return fmt.Sprintf("refusing to migrate: migration(s) %s cannot work with the live relay(s) %s: "+
		"replace them with this release first, or run again with --force (MigrateOptions.IgnoreRelaysBehind): "+
		"the older relays then stop claiming (or, of a release that records no version, may skip rows) until they are replaced",
		strings.Join(ms, ", "), strings.Join(rs, ", "))
}

// DescribeRelayVersion says which schema version and release r runs with,
// for messages and listings.
func DescribeRelayVersion(r RelayStatus) string {
	v := "schema version unknown (an older release)"
	if r.SchemaVersion > 0 {
		v = fmt.Sprintf("schema version %d", r.SchemaVersion)
	}
	if r.Release != "" {
		v += ", release " + r.Release
	}
	return v
}

// SchemaCheck is what a relay's Source found about its table's schema.
type SchemaCheck struct {
	// TableVersion is the table's schema version.
	TableVersion int
	// RelayVersion is the newest schema version the relay's code knows.
	RelayVersion int
	// RelaysFrom is the oldest relay schema version the table works with
	// (0: every one).
	RelaysFrom int
}

// Compatible reports whether the relay can work with the table.
func (c SchemaCheck) Compatible() bool { return c.RelaysFrom <= c.RelayVersion }

// SchemaChecker is a Source that can tell whether the relay's code can
// work with its table as the database records it now. The relay asks at
// every lease upkeep, and stops claiming while the answer is no.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) (SchemaCheck, error)
}
