package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	binlog "github.com/outboxkit/outbox/outboxmysql/cdc"
)

// TestGrantsLetTheRelayTailTheBinlogOnMySQL: with --relay-binlog the
// relay's account gets the replication privileges and the streamer's
// table, and a binary log relay connected as it (its replication
// connection too) relays and dead-letters under its lease; without
// the flag the plan grants no replication privilege and says how to.
// Needs the test MariaDB with a row-based binary log (docs/binlog.md).
func TestGrantsLetTheRelayTailTheBinlogOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 4*time.Minute)
	admin := mysqlDB(t, mysqlServerURL())
	name := testenv.MySQLDatabase(t, admin, "t")
	tb := outboxdriver.Table{Schema: name, Name: "outbox"}
	owner, _ := testenv.MySQLAs(t, admin, "outbox_owner", name, "GRANT ALL PRIVILEGES ON `"+name+"`.* TO %s")
	if out, stderr, code := run(t, nil, "migrate", "--db", myURLAs(t, owner, name)); code != 0 {
		t.Fatalf("migrate as the owner: %d %s %s", code, out, stderr)
	}
	relayUser, relayDB := testenv.MySQLAs(t, admin, "outbox_relay", name)
	db := []string{"--db", mysqlURL(t, name)}

	out, err := runInProcess(t, "", append([]string{"grants", "--relay", relayUser}, db...)...)
	if err != nil || !strings.Contains(out, "-- A relay that tails the binary log (relay --source binlog) also needs REPLICATION SLAVE, REPLICATION CLIENT on *.*: run again with --relay-binlog.") ||
		strings.Contains(out, "GRANT REPLICATION") || !strings.Contains(out, "GRANT SELECT, INSERT, UPDATE ON `"+name+"`.`outbox_binlog` TO '"+relayUser+"'@'%'") {
		t.Fatalf("grants --relay (no --relay-binlog): %v\n%s", err, out)
	}
	args := append([]string{"grants", "--relay", relayUser, "--relay-binlog"}, db...)
	out, err = runInProcess(t, "", args...)
	if err != nil || !strings.Contains(out, "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+relayUser+"'@'%';") ||
		!strings.Contains(out, "-- relay "+relayUser+"@% tails the binary log: REPLICATION SLAVE, REPLICATION CLIENT on the whole server") {
		t.Fatalf("grants --relay-binlog: %v\n%s", err, out)
	}
	if out, err := runInProcess(t, "", append(args, "--apply")...); err != nil || !strings.Contains(out, "statement(s) applied") {
		t.Fatalf("grants --relay-binlog --apply: %v\n%s", err, out)
	}

	// Events of a writer (here the admin), and a relay as the account.
	flow, poison := jobEvents()
	flowIDs := ids(flow)
	ids(poison)
	if err := testenv.WriteSQL(ctx, testenv.MySQL(t, name), outboxmysql.New(nil), tb, true, append(flow, poison...)...); err != nil {
		t.Fatal(err)
	}
	cfg := testenv.MySQLConfig(t, name)
	cfg.User, cfg.Passwd = relayUser, ""
	src, err := binlog.NewSource(relayDB, tb, &binlog.Config{DSN: cfg.FormatDSN(), SaveInterval: 100 * time.Millisecond,
		SourceConfig: outboxdriver.SourceConfig{Retention: outboxdriver.RetentionKeep, RelayName: "relay-1", Logger: slog.New(slog.NewTextHandler(testLogWriter{t}, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	drain(t, ctx, src, flowIDs, func() (int64, error) {
		var n int64
		err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+name+"`.`outbox_dead_letter`").Scan(&n)
		return n, err
	})
	var epoch int64
	if err := admin.QueryRowContext(ctx, "SELECT epoch FROM `"+name+"`.`outbox_binlog` WHERE name = 'default'").Scan(&epoch); err != nil || epoch < 1 {
		t.Fatalf("the relay took no lease of the binary log as the account (epoch %d, %v)", epoch, err)
	}
	var backlog int64
	if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+name+"`.`outbox` WHERE published_at IS NULL").Scan(&backlog); err != nil || backlog != int64(len(poison)-3) {
		t.Fatalf("%d rows unpublished (%v), want the %d poison events held behind the 3 dead letters (which left the table)", backlog, err, len(poison)-3)
	}
}

// --relay-binlog is for MySQL/MariaDB, and goes with --relay.
func TestGrantsRelayBinlogNeedsMySQLAndARelay(t *testing.T) {
	t.Parallel()
	failsWithOneLine(t, nil, "--relay-binlog is for MySQL/MariaDB", "grants", "--db", testenv.DatabaseURL(), "--relay", "x", "--relay-binlog")
	failsWithOneLine(t, nil, "--relay-binlog needs --relay", "grants", "--db", mysqlServerURL(), "--writer", "x", "--relay-binlog")
}

// testLogWriter writes a logger's lines to the test's log.
type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
