package cdc_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
)

// TestBinlogOtherTablesSkipped: the outbox's few events come through a
// log full of other tables' changes (large multi-row statements of a
// table of the same database, and a table of the same name in another
// database, written between the outbox's transactions): exactly the
// outbox's events arrive, in order. The rows of other tables are not
// decoded at all (mysqlbinlog's TestSkipTable).
func TestBinlogOtherTablesSkipped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	src := f.source("r1", 0, outboxdriver.RetentionKeep)
	leases := f.acquire(src, 10*time.Second)
	f.streaming(src, leases)

	admin := testenv.MySQL(t, "")
	other := testenv.MySQLDatabase(t, admin, "ot")
	otherDB := testenv.MySQL(t, other)
	otherTb := outboxdriver.Table{Schema: other, Name: f.tb.Name}
	if _, err := outboxmysql.New(otherDB).Migrate(f.ctx, otherTb, nil); err != nil {
		t.Fatal(err)
	}
	noise := "`" + f.tb.Schema + "`.`noise`"
	if _, err := f.db.ExecContext(f.ctx, `CREATE TABLE `+noise+` (id INT AUTO_INCREMENT PRIMARY KEY, body TEXT NOT NULL) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	row := "(" + "'" + strings.Repeat("x", 1000) + "'" + ")"
	rows := strings.TrimSuffix(strings.Repeat(row+",", 200), ",")
	const events = 20
	for i := range events {
		if _, err := f.db.ExecContext(f.ctx, `INSERT INTO `+noise+` (body) VALUES `+rows); err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.ExecContext(f.ctx, `UPDATE `+noise+` SET body = CONCAT('y', body) WHERE id % 7 = ?`, i%7); err != nil {
			t.Fatal(err)
		}
		// The same table name in another database: not ours.
		if err := testenv.WriteSQL(f.ctx, otherDB, outboxmysql.New(otherDB), otherTb, true, ev("theirs", i), ev("theirs", 1000+i)); err != nil {
			t.Fatal(err)
		}
		f.write(true, ev("ours", i))
	}
	got := f.collect(src, leases, events)
	for i, r := range got {
		if r.AggregateID != "ours" || string(r.Payload) != fmt.Sprintf(`{"n": %d}`, i) {
			t.Fatalf("record %d is %s %s, want ours %d", i, r.AggregateID, r.Payload, i)
		}
	}
	// Nothing more comes: a marker written last is the next event.
	marker := ev("marker", 1)
	marker.ID = "00000000-0000-4000-8000-0000000f00d5"
	f.write(true, marker)
	if next := f.collect(src, leases, 1); next[0].ID != marker.ID {
		t.Fatalf("after the %d events came %s %s, want the marker", events, next[0].AggregateID, next[0].Payload)
	}
}
