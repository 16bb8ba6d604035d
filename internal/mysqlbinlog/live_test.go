package mysqlbinlog

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
)

// server is the test MariaDB: an admin pool, a fresh database, and the
// address and account the replication client connects with.
type server struct {
	admin *sql.DB
	db    *sql.DB
	name  string
	cfg   Config
}

// newServer opens the test MariaDB (OUTBOX_TEST_MYSQL_DSN) and a fresh
// database on it. It fails, saying how to start it, when it is down.
func newServer(t *testing.T) *server {
	t.Helper()
	admin := testenv.MySQL(t, "")
	name := testenv.MySQLDatabase(t, admin, "binlog")
	mc := testenv.MySQLConfig(t, name)
	return &server{
		admin: admin,
		db:    testenv.MySQL(t, name),
		name:  name,
		cfg:   Config{Addr: mc.Addr, User: mc.User, Password: mc.Passwd},
	}
}

// replicaID is a server id no other test's replica uses at the same time.
func replicaID() uint32 { return 100000 + rand.Uint32N(1<<30) }

func (s *server) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// dial connects as the server's account and checks the server.
func (s *server) dial(t *testing.T, cfg Config) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", cfg.Addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// status is the server's current position and GTID position.
func (s *server) status(t *testing.T) (Position, string) {
	t.Helper()
	c := s.dial(t, s.cfg)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pos, gtid, err := c.MasterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return pos, gtid
}

// dump starts a stream.
func (s *server) dump(t *testing.T, dc DumpConfig) *Stream {
	t.Helper()
	c := s.dial(t, s.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.CheckServer(ctx); err != nil {
		t.Fatal(err)
	}
	if dc.ServerID == 0 {
		dc.ServerID = replicaID()
	}
	st, err := c.StartDump(ctx, dc)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// rowsOf reads the stream until it has seen want statements' rows of
// table, skipping other tables' (other tests write to the same log). The
// rows events of one statement (the server splits large ones) are joined.
func rowsOf(t *testing.T, st *Stream, schema, table string, want int) []*RowsEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got []*RowsEvent
	var pending *RowsEvent
	for len(got) < want {
		ev, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("after %d rows events: %v", len(got), err)
		}
		re, ok := ev.Body.(*RowsEvent)
		if !ok || re.Table.Schema != schema || re.Table.Table != table {
			continue
		}
		if pending == nil {
			pending = re
		} else {
			pending.Rows = append(pending.Rows, re.Rows...)
		}
		if re.EndOfStatement {
			got = append(got, pending)
			pending = nil
		}
	}
	return got
}

func TestLiveRowValues(t *testing.T) {
	s := newServer(t)
	s.exec(t, `CREATE TABLE v (
		id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		i INT NULL, ti TINYINT NULL, si SMALLINT NULL, mi MEDIUMINT NULL,
		vc VARCHAR(255) CHARACTER SET utf8mb4 NULL,
		ch CHAR(36) CHARACTER SET ascii NULL,
		bin BINARY(16) NULL,
		u UUID NULL,
		dt DATETIME(6) NULL, ts TIMESTAMP(6) NULL, dt0 DATETIME NULL,
		js JSON NULL, lt LONGTEXT NULL, lb LONGBLOB NULL, tx TEXT NULL,
		dc DECIMAL(12,3) NULL, db DOUBLE NULL, fl FLOAT NULL,
		d DATE NULL, tm TIME(3) NULL, y YEAR NULL, b BIT(5) NULL,
		e ENUM('a','b','c') NULL, big BIGINT NULL
	)`)
	pos, _ := s.status(t)
	st := s.dump(t, DumpConfig{Position: pos})

	s.exec(t, "SET time_zone = '+00:00'")
	bin := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0}
	ctx := context.Background()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET time_zone = '+00:00'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO v (i, ti, si, mi, vc, ch, bin, u, dt, ts, dt0, js, lt, lb, tx, dc, db, fl, d, tm, y, b, e, big)
		VALUES (-7, -128, 32767, -8388608, 'héllo wörld', '0c5e7d2a-3b1f-4a8e-9c7d-1e2f3a4b5c6d', ?, '123e4567-e89b-12d3-a456-426614174000',
		'2026-12-07 17:45:01.123456', '2026-12-07 17:45:02.654321', '1999-12-31 23:59:59',
		'{"a": [1, 2, {"b": null}], "c": "d"}', ?, ?, 'text', -123456789.125, 2.5, 0.25,
		'2024-02-29', '-12:34:56.789', 2155, b'10101', 'c', -9223372036854775808),
		(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)`,
		bin, strings.Repeat("x", 70000), []byte{0xff, 0x00, 0xfe}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "UPDATE v SET i = 8, vc = 'bye' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "DELETE FROM v WHERE id = 2"); err != nil {
		t.Fatal(err)
	}

	evs := rowsOf(t, st, s.name, "v", 3)
	ins, upd, del := evs[0], evs[1], evs[2]
	if !ins.Insert() || len(ins.Rows) != 2 {
		t.Fatalf("first event: insert %v with %d rows, want an insert of 2", ins.Insert(), len(ins.Rows))
	}
	want := []any{
		int64(1), int64(-7), int64(-128), int64(32767), int64(-8388608),
		[]byte("héllo wörld"), []byte("0c5e7d2a-3b1f-4a8e-9c7d-1e2f3a4b5c6d"), bin[:15], // trailing zero stripped
		nil, // UUID: checked below
		time.Date(2026, 12, 7, 17, 45, 1, 123456000, time.UTC),
		time.Date(2026, 12, 7, 17, 45, 2, 654321000, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC),
		[]byte(`{"a": [1, 2, {"b": null}], "c": "d"}`),
		[]byte(strings.Repeat("x", 70000)), []byte{0xff, 0x00, 0xfe}, []byte("text"),
		"-123456789.125", 2.5, float32(0.25),
		time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		-(12*time.Hour + 34*time.Minute + 56*time.Second + 789*time.Millisecond),
		int64(2155), uint64(0b10101), int64(3), int64(-9223372036854775808),
	}
	row := ins.Rows[0]
	for i, w := range want {
		if i == 8 {
			continue
		}
		if !equal(row[i], w) {
			t.Errorf("column %d: got %#v (%T), want %#v (%T)", i+1, row[i], row[i], w, w)
		}
	}
	// BINARY(16) and MariaDB's UUID are logged without their trailing
	// zero bytes; FixedLength gives the length to pad them back to.
	if n := ins.Table.FixedLength(7); n != 16 {
		t.Errorf("BINARY(16) fixed length %d, want 16", n)
	}
	if n := ins.Table.FixedLength(8); n != 16 {
		t.Errorf("UUID fixed length %d, want 16", n)
	}
	if n := ins.Table.FixedLength(6); n != 36 {
		t.Errorf("CHAR(36) ascii fixed length %d, want 36", n)
	}
	u, _ := row[8].([]byte)
	if u = append(u, make([]byte, 16-min(len(u), 16))...); !bytes.Equal(u, []byte{0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17, 0x40, 0x00}) {
		t.Errorf("uuid column padded: got %x, want 123e4567e89b12d3a456426614174000", u)
	}
	for i, v := range ins.Rows[1][1:] {
		if v != nil {
			t.Errorf("second row column %d: got %#v, want NULL", i+2, v)
		}
	}
	if !upd.Update() || len(upd.Rows) != 2 {
		t.Fatalf("second event: update %v with %d rows, want an update with a before and after image", upd.Update(), len(upd.Rows))
	}
	if !equal(upd.Rows[0][1], int64(-7)) || !equal(upd.Rows[1][1], int64(8)) || !equal(upd.Rows[1][5], []byte("bye")) {
		t.Errorf("update images: before i=%#v, after i=%#v vc=%#v", upd.Rows[0][1], upd.Rows[1][1], upd.Rows[1][5])
	}
	if !equal(upd.Rows[1][2], int64(-128)) {
		t.Errorf("update after image without its unchanged column (binlog_row_image=FULL): ti=%#v", upd.Rows[1][2])
	}
	if !del.Delete() || len(del.Rows) != 1 || !equal(del.Rows[0][0], int64(2)) {
		t.Errorf("third event: delete %v rows %v, want the delete of id 2", del.Delete(), del.Rows)
	}
}

func equal(a, b any) bool {
	switch x := a.(type) {
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	}
	return a == b
}

// TestLiveRollbackNeverLogged: a rolled-back transaction is not in the
// log; the committed one after it is.
func TestLiveRollbackNeverLogged(t *testing.T) {
	s := newServer(t)
	s.exec(t, "CREATE TABLE r (id INT PRIMARY KEY, what VARCHAR(20))")
	pos, _ := s.status(t)
	st := s.dump(t, DumpConfig{Position: pos})
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO r VALUES (1, 'rolled back')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	s.exec(t, "INSERT INTO r VALUES (2, 'committed')")
	evs := rowsOf(t, st, s.name, "r", 1)
	if got := evs[0].Rows[0][0]; got != int64(2) {
		t.Fatalf("first rows event of the table holds id %v, want 2 (the rolled-back 1 must never appear)", got)
	}
}

// TestLiveTransactionBoundaries: a MariaDB transaction is a GTID event,
// its rows, and an XID.
func TestLiveTransactionBoundaries(t *testing.T) {
	s := newServer(t)
	s.exec(t, "CREATE TABLE b (id INT PRIMARY KEY)")
	pos, _ := s.status(t)
	st := s.dump(t, DumpConfig{Position: pos})
	s.exec(t, "INSERT INTO b VALUES (1), (2)")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var gtid *MariaGTIDEvent
	for {
		ev, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch b := ev.Body.(type) {
		case *MariaGTIDEvent:
			gtid = b
		case *RowsEvent:
			if b.Table.Schema != s.name {
				gtid = nil
				continue
			}
			if gtid == nil || gtid.Standalone {
				t.Fatalf("rows event not preceded by a transaction's GTID event: %+v", gtid)
			}
			if len(b.Rows) != 2 || !b.EndOfStatement {
				t.Fatalf("rows event: %d rows, end of statement %v; want 2 rows, end", len(b.Rows), b.EndOfStatement)
			}
			for {
				ev, err := st.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if x, ok := ev.Body.(*XIDEvent); ok {
					if x.XID == 0 {
						t.Fatal("XID 0")
					}
					if st.Position().Offset != ev.Header.LogPos || st.Position().File == "" {
						t.Fatalf("position after the XID %v, want offset %d", st.Position(), ev.Header.LogPos)
					}
					return
				}
				if ev.Body != nil {
					if _, ok := ev.Body.(*TableMapEvent); !ok {
						t.Fatalf("between rows and XID: %T", ev.Body)
					}
				}
			}
		}
	}
}

// TestLiveStartFromPosition and …FromMariaGTID: a stream started at a
// saved place begins with the first transaction after it.
func TestLiveStartFromPosition(t *testing.T) {
	s := newServer(t)
	s.exec(t, "CREATE TABLE p (id INT PRIMARY KEY)")
	s.exec(t, "INSERT INTO p VALUES (1)")
	pos, _ := s.status(t)
	s.exec(t, "INSERT INTO p VALUES (2)")
	st := s.dump(t, DumpConfig{Position: pos})
	if got := rowsOf(t, st, s.name, "p", 1)[0].Rows[0][0]; got != int64(2) {
		t.Fatalf("first row after %v: id %v, want 2", pos, got)
	}
}

func TestLiveStartFromMariaGTID(t *testing.T) {
	s := newServer(t)
	s.exec(t, "CREATE TABLE g (id INT PRIMARY KEY)")
	s.exec(t, "INSERT INTO g VALUES (1)")
	_, gtid := s.status(t)
	if gtid == "" {
		t.Fatal("the server has no GTID position after a transaction")
	}
	s.exec(t, "INSERT INTO g VALUES (2)")
	start, err := ParseMariaGTIDPos(gtid)
	if err != nil {
		t.Fatal(err)
	}
	st := s.dump(t, DumpConfig{MariaGTID: start})
	if got := rowsOf(t, st, s.name, "g", 1)[0].Rows[0][0]; got != int64(2) {
		t.Fatalf("first row after GTID %s: id %v, want 2", gtid, got)
	}
	if st.Position().File == "" {
		t.Fatal("a GTID start did not learn its file from the fake rotate")
	}
}

// TestLiveHeartbeat: an idle stream gets heartbeats at the asked period.
func TestLiveHeartbeat(t *testing.T) {
	s := newServer(t)
	pos, _ := s.status(t)
	st := s.dump(t, DumpConfig{Position: pos, Heartbeat: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		ev, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if hb, ok := ev.Body.(*HeartbeatEvent); ok {
			if hb.File == "" {
				t.Fatal("heartbeat without a file name")
			}
			return
		}
	}
}

// TestLiveCancel: a context ends a waiting Next.
func TestLiveCancel(t *testing.T) {
	s := newServer(t)
	pos, _ := s.status(t)
	st := s.dump(t, DumpConfig{Position: pos})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Next(ctx); err != nil {
				done <- err
				return
			}
		}
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Next after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Next did not return within 30s of its context's cancel")
	}
}

// TestLivePrivileges: an account without REPLICATION CLIENT (BINLOG
// MONITOR) or without REPLICATION SLAVE gets one line naming it.
func TestLivePrivileges(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	none, _ := testenv.MySQLAs(t, s.admin, "nopriv", s.name)
	cfg := s.cfg
	cfg.User, cfg.Password = none, ""
	err := s.dial(t, cfg).CheckServer(ctx)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "REPLICATION CLIENT") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("CheckServer without privileges: %v, want one line naming REPLICATION CLIENT", err)
	}

	client, _ := testenv.MySQLAs(t, s.admin, "noslave", s.name, "GRANT BINLOG MONITOR ON *.* TO %s")
	cfg.User = client
	c := s.dial(t, cfg)
	if err := c.CheckServer(ctx); err != nil {
		t.Fatalf("CheckServer with BINLOG MONITOR: %v", err)
	}
	_, err = c.StartDump(ctx, DumpConfig{ServerID: replicaID()})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "REPLICATION SLAVE") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("StartDump without REPLICATION SLAVE: %v, want one line naming REPLICATION SLAVE", err)
	}
}

// TestLivePositionLost: a file the server does not have is
// ErrPositionLost.
func TestLivePositionLost(t *testing.T) {
	s := newServer(t)
	st := s.dump(t, DumpConfig{Position: Position{File: "mysql-bin.999999", Offset: 4}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := st.Next(ctx)
	if !errors.Is(err, ErrPositionLost) {
		t.Fatalf("Next from a missing file: %v, want ErrPositionLost", err)
	}
}

// TestLivePasswordAuth: an account with a password logs in through
// mysql_native_password; a wrong password is refused.
func TestLivePasswordAuth(t *testing.T) {
	s := newServer(t)
	user, _ := testenv.MySQLAs(t, s.admin, "pw", s.name, "ALTER USER %s IDENTIFIED BY 's3cret-pw'")
	cfg := s.cfg
	cfg.User, cfg.Password = user, "s3cret-pw"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := s.dial(t, cfg)
	if v, err := c.QueryValue(ctx, "SELECT CURRENT_USER()"); err != nil || !strings.HasPrefix(v, user+"@") {
		t.Fatalf("logged in as %q, %v; want %s", v, err, user)
	}
	cfg.Password = "wrong"
	_, err := Dial(ctx, cfg)
	var se *ServerError
	if !errors.As(err, &se) || se.Code != erAccessDenied {
		t.Fatalf("wrong password: %v, want access denied (1045)", err)
	}
}
