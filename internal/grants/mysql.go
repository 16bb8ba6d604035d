package grants

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxkit/outbox/outboxdriver"
)

// MySQLVersion is the first MySQL/MariaDB schema version whose audit is
// pruned by a procedure that runs as its definer (migration 5).
const MySQLVersion = 5

// myRights is what each job may do on one table (suffix "" is the outbox
// table itself), read from the SQL each component runs: the writer's
// INSERT (outboxmysql), the relay (outboxmysql source) and the operators'
// Store (internal/sqlstore). The marker table <table>_audit_prune is the
// owner's alone.
type myRights struct {
	suffix                 string
	writer, relay, console string
	since                  int // the schema version that made the table; 0: every version grants works on
}

var myTables = []myRights{
	{suffix: "", writer: "INSERT (" + writerColumns + ")",
		relay:   "SELECT, UPDATE (published_at, attempts, last_error, next_attempt_at), DELETE",
		console: "SELECT, INSERT, DELETE"},
	{suffix: "_dead_letter", relay: "SELECT, INSERT", console: "SELECT, UPDATE (payload, payload_raw, headers, held), DELETE"},
	{suffix: "_leases", relay: "SELECT, UPDATE", console: "SELECT"},
	// One row per partition, locked FOR UPDATE by the batch relaying it.
	{suffix: "_claims", relay: "SELECT, UPDATE"},
	{suffix: "_relays", relay: "SELECT, INSERT, UPDATE, DELETE", console: "SELECT"},
	{suffix: "_held", relay: "SELECT, INSERT, UPDATE, DELETE", console: "SELECT, DELETE"},
	{suffix: "_audit", console: "SELECT, INSERT"},
	{suffix: "_migrations", relay: "SELECT", console: "SELECT"},
	{suffix: "_pause", relay: "SELECT", console: "SELECT, INSERT, DELETE"},
	// The masking stored with the table: read by every process that shows
	// a payload, changed by the owner alone (`outbox mask`).
	{suffix: "_masking", relay: "SELECT", console: "SELECT"},
	{suffix: "_samples", console: "SELECT, INSERT, DELETE"},
	{suffix: "_requests", console: "SELECT, INSERT, UPDATE"},
	{suffix: "_audit_prune"},
	// The binary log streamer's lease and position (outboxmysql/cdc):
	// inserted once, locked FOR UPDATE and updated by the streamer.
	{suffix: "_binlog", since: 8, relay: "SELECT, INSERT, UPDATE", console: "SELECT"},
}

// BinlogVersion is the first MySQL/MariaDB schema version with the binary
// log streamer's table (migration 8).
const BinlogVersion = 8

// myReplication are the server-wide privileges a relay that tails the
// binary log needs: REPLICATION SLAVE to stream it, REPLICATION CLIENT
// (MariaDB 10.5+: its alias BINLOG MONITOR) for SHOW MASTER STATUS and
// SHOW BINARY LOGS.
const myReplication = "REPLICATION SLAVE, REPLICATION CLIENT"

// myWide are the privileges that, held on a whole database or on every
// database, reach past a table's grants to change the outbox's tables or
// call its prune.
var myWide = []string{"Insert_priv", "Update_priv", "Delete_priv", "Drop_priv", "Alter_priv", "Create_priv", "Index_priv", "Trigger_priv", "Execute_priv", "Alter_routine_priv"}

// myAccount is an existing account: its user and host.
type myAccount struct {
	flag, user, host string
}

// quoted is the account as GRANT names it.
func (a myAccount) quoted() string {
	if a.host == "" {
		return "'" + a.user + "'" // a role
	}
	return "'" + a.user + "'@'" + a.host + "'"
}

// kind is "role" for a MariaDB role (an entry of mysql.user without a
// host), "account" otherwise.
func (a myAccount) kind() string {
	if a.host == "" {
		return "role"
	}
	return "account"
}

func (a myAccount) String() string {
	if a.host == "" {
		return a.user
	}
	return a.user + "@" + a.host
}

// myQuote quotes a validated MySQL identifier.
func myQuote(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// MySQL reads the outbox table t (t.Schema is the database) of db and
// returns the plan that gives r's accounts their jobs. A name may be USER
// or USER@HOST; USER alone must match one account. It refuses accounts
// that do not exist, job accounts with rights on the whole database or on
// every database (no table grant narrows those), a job account that is
// the prune procedure's definer, and a table not migrated to MySQLVersion.
func MySQL(ctx context.Context, db *sql.DB, t outboxdriver.Table, r Roles) (Plan, error) {
	if err := t.Validate(); err != nil {
		return Plan{}, err
	}
	if err := r.validate(true); err != nil {
		return Plan{}, err
	}
	q := func(suffix string) string { return myQuote(t.Schema) + "." + myQuote(t.Name+suffix) }
	var version sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM `+q("_migrations")).Scan(&version); err != nil {
		return Plan{}, fmt.Errorf("schema version of %s (is it migrated? run `outbox migrate` first): %w", t, err)
	}
	if version.Int64 < MySQLVersion {
		return Plan{}, fmt.Errorf("%s is at schema version %d: run `outbox migrate` first (version %d prunes the audit through a procedure that runs as the owner)", t, version.Int64, MySQLVersion)
	}
	if r.RelayBinlog && version.Int64 < BinlogVersion {
		return Plan{}, fmt.Errorf("%s is at schema version %d: run `outbox migrate` first (version %d has the binary log streamer's table %s_binlog)", t, version.Int64, BinlogVersion, t.Name)
	}
	var definer string
	err := db.QueryRowContext(ctx, `SELECT DEFINER FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'`, t.Schema, t.Name+"_audit_prune").Scan(&definer)
	if errors.Is(err, sql.ErrNoRows) {
		return Plan{}, fmt.Errorf("%s has no procedure %s_audit_prune: run `outbox migrate`", t, t.Name)
	}
	if err != nil {
		return Plan{}, fmt.Errorf("the prune procedure of %s: %w", t, err)
	}
	accounts := map[string]myAccount{}
	for _, j := range r.jobs() {
		a, err := lookUpAccount(ctx, db, j)
		if err != nil {
			return Plan{}, err
		}
		if j.flag != "owner" {
			if a.String() == definer {
				return Plan{}, fmt.Errorf("--%s %s: the account is the definer of the audit's prune procedure (it migrated the tables) and may do anything to them: give the job to another account", j.flag, j.role)
			}
			if err := checkWide(ctx, db, t, a); err != nil {
				return Plan{}, err
			}
		}
		accounts[j.flag] = a
	}

	p := Plan{Database: "MySQL/MariaDB"}
	p.Header = append(p.Header, fmt.Sprintf("outbox grants for %s on MySQL/MariaDB (schema version %d)", t, version.Int64),
		"MySQL/MariaDB commits each GRANT and REVOKE on its own: run the whole script; running it again gives the same rights",
		"the audit's prune procedure runs as its definer, "+definer+" (the account that ran migrate)")
	if a, ok := accounts["owner"]; ok {
		p.Header = append(p.Header, "owner "+a.String()+": every right on the tables (DDL), prunes the audit")
	}
	for _, j := range []struct{ flag, what string }{
		{"writer", "inserts events, and nothing else"},
		{"relay", "claims, marks, retries, dead-letters and cleans up events, holds leases"},
		{"console", "what package ops does (dead letters, pauses, held aggregates, requests, replay, repair); reads and appends the audit"},
	} {
		if a, ok := accounts[j.flag]; ok {
			name := a.String()
			if a.kind() == "role" {
				name = "role " + name
			}
			p.Header = append(p.Header, j.flag+" "+name+": "+j.what)
		}
	}
	if a, ok := accounts["relay"]; ok && r.RelayBinlog {
		p.Header = append(p.Header, "relay "+a.String()+" tails the binary log: "+myReplication+" on the whole server (the log holds every database's changes)")
	}
	// Exactly the job: whatever the accounts held on these tables goes.
	for _, j := range r.jobs() {
		a := accounts[j.flag]
		if j.flag == "owner" {
			continue
		}
		held, err := heldTables(ctx, db, t, a)
		if err != nil {
			return Plan{}, err
		}
		for _, name := range held {
			p.Statements = append(p.Statements, "REVOKE ALL PRIVILEGES ON "+myQuote(t.Schema)+"."+myQuote(name)+" FROM "+a.quoted())
		}
		procs, err := heldProcs(ctx, db, t, a)
		if err != nil {
			return Plan{}, err
		}
		for _, name := range procs {
			p.Statements = append(p.Statements, "REVOKE ALL PRIVILEGES ON PROCEDURE "+myQuote(t.Schema)+"."+myQuote(name)+" FROM "+a.quoted())
		}
	}
	for _, g := range myTables {
		if version.Int64 < int64(g.since) {
			continue // not made yet: run outbox migrate
		}
		for _, jr := range []struct{ flag, privs string }{{"writer", g.writer}, {"relay", g.relay}, {"console", g.console}, {"owner", "ALL PRIVILEGES"}} {
			if a, ok := accounts[jr.flag]; ok && jr.privs != "" {
				p.Statements = append(p.Statements, "GRANT "+jr.privs+" ON "+q(g.suffix)+" TO "+a.quoted())
			}
		}
	}
	if a, ok := accounts["owner"]; ok {
		p.Statements = append(p.Statements, "GRANT EXECUTE ON PROCEDURE "+q("_audit_prune")+" TO "+a.quoted())
	}
	if a, ok := accounts["relay"]; ok && r.RelayBinlog {
		p.Statements = append(p.Statements, "GRANT "+myReplication+" ON *.* TO "+a.quoted())
	}
	owner := definer
	if a, ok := accounts["owner"]; ok {
		owner = a.String()
	}
	p.Notes = append(p.Notes,
		"Prune the audit as the owner: outbox audit prune --db mysql://"+strings.Split(owner, "@")[0]+"@HOST/"+t.Schema+" --before TIME",
		"A TRUNCATE fires no trigger: it takes the DROP privilege, which no job account holds.")
	if _, ok := accounts["relay"]; ok && !r.RelayBinlog {
		p.Notes = append(p.Notes, "A relay that tails the binary log (relay --source binlog) also needs "+myReplication+" on *.*: run again with --relay-binlog.")
	}
	for _, j := range r.jobs() {
		if a := accounts[j.flag]; j.flag != "owner" && a.kind() == "role" {
			p.Notes = append(p.Notes, "The "+j.flag+"'s accounts act through the role "+a.user+" once it is their default role (MariaDB): GRANT "+myQuote(a.user)+" TO 'USER'@'HOST'; SET DEFAULT ROLE "+myQuote(a.user)+" FOR 'USER'@'HOST';")
		}
	}
	return p, nil
}

// lookUpAccount finds the account j names in mysql.user: USER@HOST, or
// USER when exactly one account has that user name.
func lookUpAccount(ctx context.Context, db *sql.DB, j job) (myAccount, error) {
	user, host, hasHost := strings.Cut(j.role, "@")
	rows, err := db.QueryContext(ctx, `SELECT Host FROM mysql.user WHERE User = ? ORDER BY Host`, user)
	if err != nil {
		return myAccount{}, fmt.Errorf("look up account %s in mysql.user (run outbox grants as an account that may read it, such as root): %w", j.role, err)
	}
	defer rows.Close()
	var hosts []string
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			return myAccount{}, err
		}
		hosts = append(hosts, h)
	}
	if err := rows.Err(); err != nil {
		return myAccount{}, err
	}
	switch {
	case hasHost && !slices.Contains(hosts, host), len(hosts) == 0:
		return myAccount{}, fmt.Errorf("--%s %s: no such account: create it first (CREATE USER '%s'@'%%' IDENTIFIED BY '...')", j.flag, j.role, user)
	case hasHost:
		return myAccount{j.flag, user, host}, nil
	case len(hosts) > 1:
		var names []string
		for _, h := range hosts {
			names = append(names, user+"@"+h)
		}
		return myAccount{}, fmt.Errorf("--%s %s: there are %d accounts of that name (%s): name one as USER@HOST", j.flag, j.role, len(hosts), strings.Join(names, ", "))
	}
	return myAccount{j.flag, user, hosts[0]}, nil
}

// checkWide refuses an account (or a MariaDB role) with write rights on
// the whole database of t, or on every database, itself or through a role
// it holds (which it may SET ROLE to, or has as its default role).
func checkWide(ctx context.Context, db *sql.DB, t outboxdriver.Table, a myAccount) error {
	if err := checkWideOf(ctx, db, t, a, a); err != nil {
		return err
	}
	roles, err := grantedRoles(ctx, db, a)
	if err != nil {
		return err
	}
	for _, r := range roles {
		if err := checkWideOf(ctx, db, t, a, r); err != nil {
			return err
		}
	}
	return nil
}

// checkWideOf refuses job account a when holder (a itself, or a role a
// holds) has write rights on the whole database of t or on every one.
func checkWideOf(ctx context.Context, db *sql.DB, t outboxdriver.Table, a, holder myAccount) error {
	cols := strings.Join(myWide, ", ")
	for _, level := range []struct{ where, on, query string }{
		{"every database", "*.*", `SELECT ` + cols + ` FROM mysql.user WHERE User = ? AND Host = ?`},
		{"database " + t.Schema, myQuote(t.Schema) + ".*", `SELECT ` + cols + ` FROM mysql.db WHERE User = ? AND Host = ? AND ? LIKE Db`},
	} {
		args := []any{holder.user, holder.host}
		if strings.Contains(level.query, "LIKE") {
			args = append(args, t.Schema)
		}
		rows, err := db.QueryContext(ctx, level.query, args...)
		if err != nil {
			return fmt.Errorf("rights of %s %s: %w", holder.kind(), holder, err)
		}
		var held []string
		for rows.Next() {
			vals := make([]sql.NullString, len(myWide))
			ptrs := make([]any, len(vals))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				rows.Close()
				return err
			}
			for i, v := range vals {
				if v.String == "Y" {
					held = append(held, strings.ToUpper(strings.ReplaceAll(strings.TrimSuffix(myWide[i], "_priv"), "_", " ")))
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(held) == 0 {
			continue
		}
		slices.Sort(held)
		held = slices.Compact(held)
		if holder != a {
			return fmt.Errorf("--%s %s: the %s holds %s on %s through the role %s, which no table grant narrows: revoke that role from it first (REVOKE %s FROM %s)",
				a.flag, a, a.kind(), strings.Join(held, ", "), level.where, holder, myQuote(holder.user), a.quoted())
		}
		return fmt.Errorf("--%s %s: the %s holds %s on %s, which no table grant narrows: revoke it first (REVOKE ALL PRIVILEGES ON %s FROM %s)",
			a.flag, a, a.kind(), strings.Join(held, ", "), level.where, level.on, a.quoted())
	}
	return nil
}

// maxRoles bounds the roles grantedRoles follows.
const maxRoles = 100

// grantedRoles lists the roles a holds, directly or through other roles:
// MariaDB's mysql.roles_mapping, or MySQL's mysql.role_edges.
func grantedRoles(ctx context.Context, db *sql.DB, a myAccount) ([]myAccount, error) {
	queries := []string{
		`SELECT Role, '' FROM mysql.roles_mapping WHERE User = ? AND Host = ?`,
		`SELECT FROM_USER, FROM_HOST FROM mysql.role_edges WHERE TO_USER = ? AND TO_HOST = ?`,
	}
	direct := func(of myAccount) ([]myAccount, error) {
		var first error
		for _, q := range queries {
			rows, err := db.QueryContext(ctx, q, of.user, of.host)
			if err != nil {
				if first == nil {
					first = err
				}
				continue // the other server's table
			}
			var out []myAccount
			for rows.Next() {
				r := myAccount{flag: a.flag}
				if err := rows.Scan(&r.user, &r.host); err != nil {
					rows.Close()
					return nil, err
				}
				out = append(out, r)
			}
			rows.Close()
			return out, rows.Err()
		}
		return nil, fmt.Errorf("roles held by %s %s (run outbox grants as an account that may read the mysql schema, such as root): %w", of.kind(), of, first)
	}
	var out []myAccount
	next := []myAccount{a}
	for len(next) > 0 && len(out) < maxRoles {
		of := next[0]
		next = next[1:]
		rs, err := direct(of)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if r != a && !slices.Contains(out, r) {
				out = append(out, r)
				next = append(next, r)
			}
		}
	}
	return out, nil
}

// heldTables lists the tables of t on which a holds rights now.
func heldTables(ctx context.Context, db *sql.DB, t outboxdriver.Table, a myAccount) ([]string, error) {
	var names []any
	for _, g := range myTables {
		names = append(names, t.Name+g.suffix)
	}
	rows, err := db.QueryContext(ctx, `SELECT Table_name FROM mysql.tables_priv WHERE Db = ? AND User = ? AND Host = ? AND Table_name IN (`+
		strings.TrimSuffix(strings.Repeat("?, ", len(names)), ", ")+`) ORDER BY Table_name`, append([]any{t.Schema, a.user, a.host}, names...)...)
	if err != nil {
		return nil, fmt.Errorf("rights of account %s in mysql.tables_priv: %w", a, err)
	}
	return strings1(rows)
}

// heldProcs lists the procedures of t on which a holds rights now.
func heldProcs(ctx context.Context, db *sql.DB, t outboxdriver.Table, a myAccount) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT Routine_name FROM mysql.procs_priv WHERE Db = ? AND User = ? AND Host = ? AND Routine_name = ? AND Routine_type = 'PROCEDURE'`,
		t.Schema, a.user, a.host, t.Name+"_audit_prune")
	if err != nil {
		return nil, fmt.Errorf("rights of account %s in mysql.procs_priv: %w", a, err)
	}
	return strings1(rows)
}

// strings1 reads one text column of every row.
func strings1(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// ApplyMySQL runs p's statements one after another (each commits); it
// stops at the first that fails and says which.
func ApplyMySQL(ctx context.Context, db *sql.DB, p Plan) error {
	for i, s := range p.Statements {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w (the %d statement(s) before it were applied; fix the cause and run outbox grants again)", s, err, i)
		}
	}
	return nil
}

// CheckMySQL tells whether t (t.Schema is the database) runs with
// separated accounts: whether accounts hold rights granted on the outbox
// table itself, as far as the account db connects as may see.
func CheckMySQL(ctx context.Context, db *sql.DB, t outboxdriver.Table) (Separation, error) {
	var s Separation
	err := db.QueryRowContext(ctx, `SELECT DEFINER FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'`, t.Schema, t.Name+"_audit_prune").Scan(&s.Owner)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("rights on %s: %w", t, err)
	}
	grantees := func(query string, args ...any) ([]string, error) {
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, fmt.Errorf("rights on %s: %w", t, err)
		}
		got, err := strings1(rows)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, g := range got {
			g = strings.ReplaceAll(g, "'", "")
			if g != s.Owner && !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	if s.Granted, err = grantees(`SELECT GRANTEE FROM information_schema.TABLE_PRIVILEGES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?
UNION SELECT GRANTEE FROM information_schema.COLUMN_PRIVILEGES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?`, t.Schema, t.Name, t.Schema, t.Name); err != nil {
		return s, err
	}
	if s.AuditChangers, err = grantees(`SELECT GRANTEE FROM information_schema.TABLE_PRIVILEGES
WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND PRIVILEGE_TYPE IN ('UPDATE', 'DELETE', 'DROP')`, t.Schema, t.Name+"_audit"); err != nil {
		return s, err
	}
	s.Separated = len(s.Granted) > 0
	if s.Separated {
		s.Text = "separated: rights on the table granted to " + strings.Join(s.Granted, ", ")
		if s.Owner != "" {
			s.Text = "separated: owner " + s.Owner + "; rights on the table granted to " + strings.Join(s.Granted, ", ")
		}
	} else {
		s.Text = "not separated: no account holds rights granted on the table itself, so writers, relays and the console use accounts with rights on the whole database, and each may change or delete any event (outbox grants; docs/security.md)"
	}
	return s, nil
}
