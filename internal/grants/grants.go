// Package grants works out the rights that give existing database roles
// exactly their job on one outbox table and its companions (`outbox
// grants`, docs/security.md): a writer inserts events and nothing else, a
// relay relays, a console acts through package ops, and the owner holds
// the tables, their DDL and the audit's prune. It also tells whether a
// table runs with its jobs separated that way (`outbox status`).
//
// A plan is read from the database (which tables, sequences and functions
// exist, who owns them, what the roles hold now) and is plain SQL: printed
// for review, or run.
package grants

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Roles names the roles (on MySQL/MariaDB, the accounts) that get a job.
// Writer, Relay and Console may be empty (that job is left alone), but not
// all three; Owner empty keeps the tables' present owner.
type Roles struct {
	Writer, Relay, Console, Owner string
	// RelayBinlog says the relay tails the MySQL/MariaDB binary log
	// (relay --source binlog, docs/binlog.md): it also gets REPLICATION
	// SLAVE and REPLICATION CLIENT on the whole server, which read every
	// database's changes in the log. MySQL/MariaDB only; needs Relay.
	RelayBinlog bool
}

// job is one of the roles a plan gives rights to.
type job struct {
	flag, role string
}

// jobs lists the roles r names with the flags that name them, owner last.
func (r Roles) jobs() []job {
	var out []job
	for _, j := range []job{{"writer", r.Writer}, {"relay", r.Relay}, {"console", r.Console}, {"owner", r.Owner}} {
		if j.role != "" {
			out = append(out, j)
		}
	}
	return out
}

// roleRE is what a role name may be: an identifier, as for every name the
// outbox quotes.
var roleRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// hostRE is what the host of a MySQL account may be: a name, an address,
// a pattern with % and _.
var hostRE = regexp.MustCompile(`^[A-Za-z0-9_.%:-]{1,255}$`)

// validate checks the names in r: each an identifier (on MySQL optionally
// @host), at least one job, no role named twice.
func (r Roles) validate(mysql bool) error {
	if r.Writer == "" && r.Relay == "" && r.Console == "" {
		return errors.New("name at least one role: --writer, --relay or --console")
	}
	if r.RelayBinlog && !mysql {
		return errors.New("--relay-binlog is for MySQL/MariaDB (the binary log); on PostgreSQL log tailing needs the REPLICATION attribute, which the output says how to give")
	}
	if r.RelayBinlog && r.Relay == "" {
		return errors.New("--relay-binlog needs --relay: the role of the relays that tail the binary log")
	}
	seen := map[string]string{}
	for _, j := range r.jobs() {
		name, host, hasHost := strings.Cut(j.role, "@")
		if hasHost && !mysql {
			return fmt.Errorf("--%s %q: a PostgreSQL role name is an identifier (letters, digits, underscores), with no @host", j.flag, j.role)
		}
		if !roleRE.MatchString(name) {
			return fmt.Errorf("--%s %q: a role name must be a letter or underscore, then letters, digits or underscores, at most 63 in all", j.flag, j.role)
		}
		if hasHost && !hostRE.MatchString(host) {
			return fmt.Errorf("--%s %q: the host after @ must be a host name, an address or a pattern with %% (letters, digits, . : - _ %%)", j.flag, j.role)
		}
		if other, ok := seen[j.role]; ok {
			return fmt.Errorf("--%s and --%s both name %s: give each job a role of its own", other, j.flag, j.role)
		}
		seen[j.role] = j.flag
	}
	return nil
}

// Plan is what gives the roles their jobs: statements to run in order,
// and notes on what no GRANT can do (printed as SQL comments).
type Plan struct {
	// Database is "PostgreSQL" or "MySQL/MariaDB".
	Database string
	// Header describes the plan: the table, the roles.
	Header []string
	// Statements run in one transaction on PostgreSQL; MySQL/MariaDB
	// commits each GRANT and REVOKE on its own.
	Statements []string
	// InTx says whether Statements run in one transaction.
	InTx bool
	// Notes say what else a job needs that GRANT cannot give.
	Notes []string
}

// Text is the plan as an SQL script: the header and notes as comments.
func (p Plan) Text() string {
	var b strings.Builder
	for _, h := range p.Header {
		b.WriteString("-- " + h + "\n")
	}
	if p.InTx {
		b.WriteString("BEGIN;\n")
	}
	for _, s := range p.Statements {
		b.WriteString(s + ";\n")
	}
	if p.InTx {
		b.WriteString("COMMIT;\n")
	}
	if len(p.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range p.Notes {
			b.WriteString("-- " + n + "\n")
		}
	}
	return b.String()
}

// Separation says whether a table's jobs run under separate roles.
type Separation struct {
	// Separated is true when roles other than the owner hold rights on
	// the outbox table (on MySQL/MariaDB: when accounts hold rights
	// granted on the table itself), so that the components can connect as
	// roles that are not the owner.
	Separated bool
	// Owner is the owner of the outbox table (PostgreSQL; on MySQL/MariaDB
	// the definer of the audit's prune procedure, if there is one).
	Owner string
	// Granted lists the roles other than the owner with rights on the
	// outbox table.
	Granted []string
	// AuditChangers lists roles other than the owner that may UPDATE,
	// DELETE or TRUNCATE the audit (PUBLIC for every role).
	AuditChangers []string
	// Text says it in one line, for `outbox status`.
	Text string
}
