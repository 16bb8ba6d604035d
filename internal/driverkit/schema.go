package driverkit

import (
	"fmt"
	"runtime/debug"

	"github.com/outboxkit/outbox/outboxdriver"
)

// NotMigrated is the error of driver for a table t that does not exist
// (or has no migrations table): every driver and every call says it the
// same way, wrapping outboxdriver.ErrNotMigrated.
func NotMigrated(driver string, t outboxdriver.Table) error {
	return fmt.Errorf("%s: %s: %w", driver, t, outboxdriver.ErrNotMigrated)
}

// MissingSchema is the error of what on t when the database reported
// that a table, column or function is missing (err), and t's schema is at
// version (0: not migrated) of latest. A table that does not exist is
// NotMigrated; one at an older version says to migrate it, with err kept
// for errors.As but not in the text (it names a table the user never
// made). At the latest version something else removed what is missing:
// MissingSchema returns nil, and the caller reports err as it is.
func MissingSchema(driver, what string, t outboxdriver.Table, version, latest int, err error) error {
	switch {
	case version <= 0:
		return NotMigrated(driver, t)
	case version < latest:
		return &outdatedError{
			msg: fmt.Sprintf("%s: %s %s: the table is at schema version %d of %d: run `outbox migrate` first", driver, what, t, version, latest),
			err: err,
		}
	}
	return nil
}

// outdatedError says what to do in its text and keeps the database's
// error underneath.
type outdatedError struct {
	msg string
	err error
}

func (e *outdatedError) Error() string { return e.msg }
func (e *outdatedError) Unwrap() error { return e.err }

// module is the path of this module, whose release a relay records.
const module = "github.com/outboxkit/outbox"

// Release is the release of this module the running binary was built
// with, as its build information records it: the module's version when it
// is a dependency or a tagged main module, "(devel)" for a build of a
// working tree, "" when the binary has no build information. Relays record
// it in the relays registry (docs/operations.md, Upgrades).
func Release() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if bi.Main.Path == module {
		if bi.Main.Version == "" {
			return "(devel)"
		}
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == module {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return "(devel)"
}
