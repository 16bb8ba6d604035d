package grants

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
)

// PostgresVersion is the first schema version whose audit is append-only
// by privilege and whose functions a writer and a relay may call without
// owning the tables (migration 19).
const PostgresVersion = 19

// writerColumns are the columns a writer inserts: Debezium's five, the
// ones WriteTx adds and deliver_at. Every other column is the relay's or
// the database's.
const writerColumns = "id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext, deliver_at"

// pgRights is what each job may do on one companion of the outbox table
// (suffix "" is the table itself), read from the SQL each component runs:
// the writer's INSERT (outboxpgx InsertTx), the polling relay (outboxpgx
// source and floors), log tailing (outboxpgx/cdc) and the operators' Store
// (outboxpgx control, dead letters, requests, inspect, status).
type pgRights struct {
	suffix                 string
	sequence               bool
	writer, relay, console string
}

var pgTables = []pgRights{
	// The relay claims (FOR UPDATE), marks published (UPDATE or DELETE),
	// retries (UPDATE), dead-letters and cleans up (DELETE). The console
	// retries dead letters and replays (INSERT, DELETE of a replayed
	// original); its replay locks rows FOR UPDATE, which takes an UPDATE
	// right on some column: last_error, which only informs.
	{suffix: "", writer: "INSERT (" + writerColumns + ")",
		relay:   "SELECT, UPDATE (published_at, attempts, last_error, next_attempt_at), DELETE",
		console: "SELECT, INSERT, DELETE, UPDATE (last_error)"},
	{suffix: "_dead_letter", relay: "SELECT, INSERT", console: "SELECT, UPDATE (payload, payload_raw, headers, held), DELETE"},
	{suffix: "_wakeup", relay: "SELECT, INSERT, UPDATE, DELETE"},
	{suffix: "_leases", relay: "SELECT, UPDATE", console: "SELECT"},
	{suffix: "_relays", relay: "SELECT, INSERT, UPDATE, DELETE", console: "SELECT"},
	{suffix: "_held", relay: "SELECT, INSERT, UPDATE, DELETE", console: "SELECT, DELETE"},
	// The relay reads the audit's highest id (a retry of dead letters
	// rewinds its floors); the console reads and appends.
	{suffix: "_audit", relay: "SELECT (id)", console: "SELECT, INSERT"},
	{suffix: "_migrations", relay: "SELECT", console: "SELECT"},
	{suffix: "_pause", relay: "SELECT", console: "SELECT, INSERT, DELETE"},
	// The masking stored with the table: every process that shows a
	// payload reads it; only the owner (`outbox mask`) changes it.
	{suffix: "_masking", relay: "SELECT", console: "SELECT"},
	{suffix: "_samples", console: "SELECT, INSERT, DELETE"},
	{suffix: "_requests", console: "SELECT, INSERT, UPDATE"},
	{suffix: "_cdc", relay: "SELECT, INSERT, UPDATE", console: "SELECT"},
	{suffix: "_cdc_drain", relay: "SELECT, INSERT, DELETE"},
	{suffix: "_cdc_parked", relay: "SELECT, INSERT, DELETE", console: "SELECT"},
	{suffix: "_tparts", relay: "SELECT", console: "SELECT"},
	// A table partitioned by time: the relay cleans up the default
	// partition itself; the others go with their partition. A default
	// partition the maintenance makes again gets the SELECT and DELETE
	// the roles hold on the outbox table (migration 22): the same.
	{suffix: pgschema.DefaultPartitionSuffix, relay: "SELECT, DELETE", console: "SELECT, DELETE"},
	// The writers' wake-up view (and the notify trigger) read it.
	{suffix: "_awake", sequence: true, writer: "SELECT"},
}

// pgFunctions is who may call which of the table's functions; the owner
// may call every one. Trigger functions are called by their triggers only.
var pgFunctions = map[string]string{
	"_cdc_write":  "writer", // insert + delete mode; runs as the owner
	"_cdc_emit":   "writer", // message mode; runs as the owner
	"_fence":      "relay",
	"_cdc_fence":  "relay",
	"_cdc_mark":   "relay",
	"_tparts_run": "relay", // time partitions; runs as the owner
}

// pgRel is one relation of the table found in the database.
type pgRel struct {
	name, kind string // relname, relkind
	identity   bool   // a sequence an identity column owns
}

// pgFunc is one function of the table found in the database.
type pgFunc struct {
	name, args string
}

// pgCatalog is what Postgres reads from the database.
type pgCatalog struct {
	t         outboxdriver.Table
	version   int
	owner     string // of the outbox table now
	rels      []pgRel
	seqName   string // the identity sequence of the outbox's seq
	funcs     []pgFunc
	publisher string // the default publication (and slot) of log tailing
}

// Postgres reads the outbox table t of the database pool connects to and
// returns the plan that gives r's roles their jobs. It refuses roles that
// do not exist, superusers (no grant limits them), a job role that is or
// may act as the owner, and a table that is not migrated to
// PostgresVersion.
func Postgres(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table, r Roles) (Plan, error) {
	if err := t.Validate(); err != nil {
		return Plan{}, err
	}
	if err := r.validate(false); err != nil {
		return Plan{}, err
	}
	c, err := readPostgres(ctx, pool, t)
	if err != nil {
		return Plan{}, err
	}
	owner := r.Owner
	if owner == "" {
		owner = c.owner
	}
	if err := checkPostgresRoles(ctx, pool, r, owner); err != nil {
		return Plan{}, err
	}
	return planPostgres(c, r), nil
}

// readPostgres reads t's relations, functions, owner and version.
func readPostgres(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table) (pgCatalog, error) {
	c := pgCatalog{t: t, publisher: cdc.DefaultSlot(t)}
	n := pgschema.NamesOf(t)
	err := pool.QueryRow(ctx, `SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = to_regclass($1)`, n.Table).Scan(&c.owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("%s does not exist: run `outbox migrate` first (as the role that is to own the tables)", t)
	}
	if err != nil {
		return c, fmt.Errorf("look up %s: %w", t, err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+n.Migrations).Scan(&c.version); err != nil {
		return c, fmt.Errorf("schema version of %s: %w", t, err)
	}
	if c.version < PostgresVersion {
		return c, fmt.Errorf("%s is at schema version %d: run `outbox migrate` first (version %d makes the audit append-only by privilege)", t, c.version, PostgresVersion)
	}
	var names []string
	for _, g := range pgTables {
		names = append(names, t.Name+g.suffix)
	}
	rows, err := pool.Query(ctx, `SELECT c.relname::text, c.relkind::text,
       c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i')
FROM pg_class c
WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
  AND c.relkind IN ('r', 'p', 'S')
  AND (c.relname = ANY($2) OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($3))
       OR c.oid = pg_get_serial_sequence($3, 'seq')::regclass)
ORDER BY c.relname`, t.Schema, names, n.Table)
	if err != nil {
		return c, fmt.Errorf("list the tables of %s: %w", t, err)
	}
	c.rels, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgRel, error) {
		var r pgRel
		err := row.Scan(&r.name, &r.kind, &r.identity)
		return r, err
	})
	if err != nil {
		return c, fmt.Errorf("list the tables of %s: %w", t, err)
	}
	var seq *string
	if err := pool.QueryRow(ctx, `SELECT (SELECT relname::text FROM pg_class WHERE oid = pg_get_serial_sequence($1, 'seq')::regclass)`, n.Table).Scan(&seq); err != nil {
		return c, fmt.Errorf("the sequence of %s: %w", t, err)
	}
	if seq != nil {
		c.seqName = *seq
	}
	var fns []string
	for suffix := range pgFunctions {
		fns = append(fns, t.Name+suffix)
	}
	// The owner's alone: the prune, the trigger functions (which move to a
	// new owner with the tables: _awake_set runs as its owner), and the
	// slot check that _cdc_emit and _cdc_write call as their owner.
	for _, suffix := range []string{"_audit_prune", "_notify", "_awake_set", "_audit_ro", "_cdc_slot"} {
		fns = append(fns, t.Name+suffix)
	}
	rows, err = pool.Query(ctx, `SELECT p.proname::text, pg_get_function_identity_arguments(p.oid)
FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1) AND p.proname = ANY($2)
ORDER BY 1, 2`, t.Schema, fns)
	if err != nil {
		return c, fmt.Errorf("list the functions of %s: %w", t, err)
	}
	c.funcs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgFunc, error) {
		var f pgFunc
		err := row.Scan(&f.name, &f.args)
		return f, err
	})
	if err != nil {
		return c, fmt.Errorf("list the functions of %s: %w", t, err)
	}
	return c, nil
}

// checkPostgresRoles refuses roles that do not exist, job roles that are
// superusers, and job roles that may act as owner.
func checkPostgresRoles(ctx context.Context, pool *pgxpool.Pool, r Roles, owner string) error {
	for _, j := range r.jobs() {
		var super, member bool
		err := pool.QueryRow(ctx, `SELECT rolsuper, pg_has_role(oid, (SELECT oid FROM pg_roles WHERE rolname = $2), 'MEMBER')
FROM pg_roles WHERE rolname = $1`, j.role, owner).Scan(&super, &member)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("--%s %s: no such role: create it first (CREATE ROLE %s LOGIN PASSWORD '...')", j.flag, j.role, outboxdriver.QuoteIdent(j.role))
		}
		if err != nil {
			return fmt.Errorf("look up role %s: %w", j.role, err)
		}
		if j.flag == "owner" {
			continue
		}
		switch {
		case super:
			return fmt.Errorf("--%s %s: the role is a superuser, which no grant limits: give the job to a role without SUPERUSER", j.flag, j.role)
		case j.role == owner:
			return fmt.Errorf("--%s %s: the role owns the tables and may do anything to them: name another owner with --owner ROLE, or give the job to another role", j.flag, j.role)
		case member:
			return fmt.Errorf("--%s %s: the role is a member of the owner %s and may act as it (SET ROLE): give the job to a role that is not", j.flag, j.role, owner)
		}
	}
	return nil
}

// planPostgres is the plan for catalog c and roles r (which were checked).
func planPostgres(c pgCatalog, r Roles) Plan {
	q := outboxdriver.QuoteIdent
	t := c.t
	owner := r.Owner
	if owner == "" {
		owner = c.owner
	}
	p := Plan{Database: "PostgreSQL", InTx: true}
	p.Header = append(p.Header, fmt.Sprintf("outbox grants for %s on PostgreSQL (schema version %d)", t, c.version))
	p.Header = append(p.Header, "owner "+owner+": owns the tables and functions (DDL), prunes the audit")
	if r.Writer != "" {
		p.Header = append(p.Header, "writer "+r.Writer+": inserts events, and nothing else")
	}
	if r.Relay != "" {
		p.Header = append(p.Header, "relay "+r.Relay+": claims, marks, retries, dead-letters and cleans up events, holds leases, maintains time partitions")
	}
	if r.Console != "" {
		p.Header = append(p.Header, "console "+r.Console+": what package ops does (dead letters, pauses, held aggregates, requests, replay, repair); reads and appends the audit")
	}
	var jobs []string
	for _, j := range r.jobs() {
		if j.flag != "owner" {
			jobs = append(jobs, q(j.role))
		}
	}
	all := strings.Join(jobs, ", ")
	role := map[string]string{"writer": r.Writer, "relay": r.Relay, "console": r.Console}
	rights := map[string]pgRights{}
	for _, g := range pgTables {
		rights[t.Name+g.suffix] = g
	}
	fn := func(f pgFunc) string { return t.Qualified(strings.TrimPrefix(f.name, t.Name)) + "(" + f.args + ")" }

	// The owner first: the rights below are granted by it.
	if r.Owner != "" && r.Owner != c.owner {
		for _, rel := range c.rels {
			switch {
			case rel.identity: // goes with its table
			case rel.kind == "S":
				p.Statements = append(p.Statements, "ALTER SEQUENCE "+q(t.Schema)+"."+q(rel.name)+" OWNER TO "+q(owner))
			default:
				p.Statements = append(p.Statements, "ALTER TABLE "+q(t.Schema)+"."+q(rel.name)+" OWNER TO "+q(owner))
			}
		}
		for _, f := range c.funcs {
			p.Statements = append(p.Statements, "ALTER FUNCTION "+fn(f)+" OWNER TO "+q(owner))
		}
		p.Statements = append(p.Statements, "GRANT USAGE, CREATE ON SCHEMA "+q(t.Schema)+" TO "+q(owner))
	}
	// Exactly the job: whatever the roles held on these objects goes.
	for _, rel := range c.rels {
		kind := "TABLE"
		if rel.kind == "S" {
			kind = "SEQUENCE"
		}
		p.Statements = append(p.Statements, "REVOKE ALL ON "+kind+" "+q(t.Schema)+"."+q(rel.name)+" FROM "+all)
	}
	for _, f := range c.funcs {
		p.Statements = append(p.Statements, "REVOKE ALL ON FUNCTION "+fn(f)+" FROM "+all)
	}
	p.Statements = append(p.Statements, "GRANT USAGE ON SCHEMA "+q(t.Schema)+" TO "+all)
	for _, rel := range c.rels {
		g, known := rights[rel.name]
		if rel.identity {
			if rel.name != c.seqName {
				continue
			}
			// The relay's floors and the console's estimates read how far
			// the outbox's sequence has gone.
			g, known = pgRights{sequence: true, relay: "SELECT", console: "SELECT"}, true
		}
		if !known {
			continue // a partition by time other than the default one
		}
		kind := "TABLE"
		if g.sequence {
			kind = "SEQUENCE"
		}
		for _, jr := range []struct{ role, privs string }{{r.Writer, g.writer}, {r.Relay, g.relay}, {r.Console, g.console}} {
			if jr.role != "" && jr.privs != "" {
				p.Statements = append(p.Statements, "GRANT "+jr.privs+" ON "+kind+" "+q(t.Schema)+"."+q(rel.name)+" TO "+q(jr.role))
			}
		}
	}
	for _, f := range c.funcs {
		suffix := strings.TrimPrefix(f.name, t.Name)
		if who := role[pgFunctions[suffix]]; who != "" {
			p.Statements = append(p.Statements, "GRANT EXECUTE ON FUNCTION "+fn(f)+" TO "+q(who))
		}
		if suffix == "_audit_prune" || suffix == "_tparts_run" {
			p.Statements = append(p.Statements, "GRANT EXECUTE ON FUNCTION "+fn(f)+" TO "+q(owner))
		}
	}

	p.Notes = append(p.Notes,
		"Prune the audit as the owner: outbox audit prune --db postgres://"+owner+"@HOST/DB --before TIME",
		"Writers in message mode (log tailing) need EXECUTE on "+t.Qualified("_cdc_emit")+" only, which the writer role gets above; it refuses while no replication slot of the table's exists.")
	if r.Relay != "" {
		p.Notes = append(p.Notes,
			"Log tailing (relay --source cdc) needs what no GRANT gives:",
			"  as a superuser: ALTER ROLE "+q(r.Relay)+" REPLICATION;",
			"  as a superuser, or as the owner with CREATE on the database: CREATE PUBLICATION "+q(c.publisher)+" FOR TABLE "+t.Qualified("")+" WITH (publish = 'insert, truncate');",
			"  the relay makes its replication slot itself.")
	}
	return p
}

// ApplyPostgres runs p's statements in one transaction.
func ApplyPostgres(ctx context.Context, pool *pgxpool.Pool, p Plan) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, s := range p.Statements {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w (nothing was changed)", s, err)
			}
		}
		return nil
	})
}

// CheckPostgres tells whether t runs with separated roles: whether roles
// other than the owner hold rights on the outbox table, and which roles
// other than the owner may change the audit.
func CheckPostgres(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table) (Separation, error) {
	var s Separation
	n := pgschema.NamesOf(t)
	err := pool.QueryRow(ctx, `SELECT r.rolname::text,
       coalesce((SELECT array_agg(DISTINCT coalesce(g.rolname::text, 'PUBLIC') ORDER BY coalesce(g.rolname::text, 'PUBLIC'))
                 FROM (SELECT (aclexplode(c.relacl)).grantee
                       UNION SELECT (aclexplode(at.attacl)).grantee FROM pg_attribute at WHERE at.attrelid = c.oid) a
                 LEFT JOIN pg_roles g ON g.oid = a.grantee
                 WHERE a.grantee <> c.relowner), '{}'),
       coalesce((SELECT array_agg(DISTINCT coalesce(g.rolname::text, 'PUBLIC') ORDER BY coalesce(g.rolname::text, 'PUBLIC'))
                 FROM pg_class ac, aclexplode(ac.relacl) a LEFT JOIN pg_roles g ON g.oid = a.grantee
                 WHERE ac.oid = to_regclass($2) AND a.grantee <> ac.relowner AND a.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE')), '{}')
FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = to_regclass($1)`, n.Table, n.Audit).Scan(&s.Owner, &s.Granted, &s.AuditChangers)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("%s: %w", t, outboxdriver.ErrNotMigrated)
	}
	if err != nil {
		return s, fmt.Errorf("rights on %s: %w", t, err)
	}
	s.Separated = len(s.Granted) > 0 && !slices.Contains(s.Granted, "PUBLIC")
	switch {
	case len(s.Granted) == 0:
		s.Text = "not separated: only the owner, " + s.Owner + ", holds rights on the table, so writers, relays and the console all connect as it (or as a superuser) and each may change or delete any event (outbox grants; docs/security.md)"
	case !s.Separated:
		s.Text = "not separated: every role (PUBLIC) holds rights on the table (outbox grants; docs/security.md)"
	default:
		s.Text = "separated: owner " + s.Owner + "; rights granted to " + strings.Join(s.Granted, ", ")
	}
	return s, nil
}
