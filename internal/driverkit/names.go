package driverkit

// Names are the rendered SQL names of an outbox table and its companions,
// as a driver's dialect quotes and qualifies them. Wakeup is PostgreSQL's
// only, Claims MySQL's only.
type Names struct {
	Table, DeadLetter, Wakeup, Migrations, Leases, Claims, Relays, Held, Audit string
}

// NamesOf renders the names of a table's tables with qualify, which turns
// a suffix of the table's name ("", "_dead_letter", ...) into the quoted,
// qualified name of that table.
func NamesOf(qualify func(suffix string) string) Names {
	return Names{
		Table:      qualify(""),
		DeadLetter: qualify("_dead_letter"),
		Wakeup:     qualify("_wakeup"),
		Migrations: qualify("_migrations"),
		Leases:     qualify("_leases"),
		Claims:     qualify("_claims"),
		Relays:     qualify("_relays"),
		Held:       qualify("_held"),
		Audit:      qualify("_audit"),
	}
}
