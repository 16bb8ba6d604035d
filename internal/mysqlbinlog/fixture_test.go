package mysqlbinlog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// capture rewrites testdata/mariadb.events from the live server.
var capture = flag.Bool("capture", false, "capture testdata/mariadb.events from the test MariaDB")

// captureFile holds a real stream of MariaDB 10.11 (binlog_checksum
// CRC32): the fake rotate, the format description, and three
// transactions on one table, each event as a 4-byte length and its bytes.
var captureFile = filepath.Join("testdata", "mariadb.events")

// TestCaptureFixture, run with -capture, records the events the fixture
// tests decode. Without -capture it checks the recorded file decodes
// from start to end with a fresh decoder, every kind of event present.
func TestCaptureFixture(t *testing.T) {
	if *capture {
		recordFixture(t)
	}
	d := NewDecoder(1)
	kinds := map[string]int{}
	for i, raw := range readFixture(t) {
		ev, err := d.Decode(raw)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		kinds[fmt.Sprintf("%T", ev.Body)]++
	}
	for _, k := range []string{"*mysqlbinlog.RotateEvent", "*mysqlbinlog.FormatDescriptionEvent",
		"*mysqlbinlog.MariaGTIDEvent", "*mysqlbinlog.TableMapEvent", "*mysqlbinlog.RowsEvent", "*mysqlbinlog.XIDEvent"} {
		if kinds[k] == 0 {
			t.Errorf("fixture has no %s (has %v)", k, kinds)
		}
	}
}

// recordFixture captures the stream of three transactions on a fresh
// table, leaving out other tests' transactions.
func recordFixture(t *testing.T) {
	s := newServer(t)
	s.exec(t, `CREATE TABLE fx (id BIGINT PRIMARY KEY, name VARCHAR(40) NULL, at DATETIME(6) NULL, doc JSON NULL, n INT NULL)`)
	pos, _ := s.status(t)
	st := s.dump(t, DumpConfig{Position: pos})
	s.exec(t, `INSERT INTO fx VALUES (1, 'one', '2026-12-07 10:00:00.5', '{"k": [1, true]}', 10), (2, NULL, NULL, NULL, NULL)`)
	s.exec(t, "UPDATE fx SET name = 'uno', n = n + 1 WHERE id = 1")
	s.exec(t, "DELETE FROM fx WHERE id = 2")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	var txn [][]byte
	ours, done := false, 0
	for done < 3 {
		var p []byte
		err := st.c.withContext(ctx, func() (err error) { p, err = st.c.pk.readPacket(); return err })
		if err != nil {
			t.Fatal(err)
		}
		if len(p) == 0 || p[0] != 0 {
			t.Fatalf("stream packet %x", p[:min(len(p), 16)])
		}
		raw := append([]byte(nil), p[1:]...)
		ev, err := st.dec.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		switch b := ev.Body.(type) {
		case *RotateEvent, *FormatDescriptionEvent:
			writeEvent(&out, raw)
			continue
		case *MariaGTIDEvent:
			txn, ours = nil, false
		case *TableMapEvent:
			ours = ours || b.Schema == s.name
		}
		txn = append(txn, raw)
		if _, ok := ev.Body.(*XIDEvent); ok && ours {
			for _, e := range txn {
				writeEvent(&out, e)
			}
			done++
		}
	}
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(captureFile, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeEvent(out *bytes.Buffer, raw []byte) {
	out.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(raw))))
	out.Write(raw)
}

// readFixture reads the captured events.
func readFixture(t testing.TB) [][]byte {
	t.Helper()
	b, err := os.ReadFile(captureFile)
	if err != nil {
		t.Fatalf("%v (recreate it with go test -run TestCaptureFixture -capture)", err)
	}
	var evs [][]byte
	for len(b) >= 4 {
		n := int(binary.LittleEndian.Uint32(b))
		if 4+n > len(b) {
			t.Fatalf("%s: truncated", captureFile)
		}
		evs = append(evs, b[4:4+n])
		b = b[4+n:]
	}
	return evs
}

// TestFixtureValues decodes the captured transactions' values.
func TestFixtureValues(t *testing.T) {
	d := NewDecoder(1)
	var rows []*RowsEvent
	for _, raw := range readFixture(t) {
		ev, err := d.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := ev.Body.(*RowsEvent); ok {
			rows = append(rows, r)
		}
	}
	if len(rows) != 3 || !rows[0].Insert() || !rows[1].Update() || !rows[2].Delete() {
		t.Fatalf("rows events: %d, want an insert, an update, a delete", len(rows))
	}
	ins := rows[0].Rows[0]
	if ins[0] != int64(1) || string(ins[1].([]byte)) != "one" || !ins[2].(time.Time).Equal(time.Date(2026, 12, 7, 10, 0, 0, 500000000, time.UTC)) ||
		string(ins[3].([]byte)) != `{"k": [1, true]}` || ins[4] != int64(10) {
		t.Errorf("inserted row: %#v", ins)
	}
	if after := rows[1].Rows[1]; string(after[1].([]byte)) != "uno" || after[4] != int64(11) {
		t.Errorf("updated row: %#v", after)
	}
	if del := rows[2].Rows[0]; del[0] != int64(2) || del[1] != nil {
		t.Errorf("deleted row: %#v", del)
	}
}

// TestChecksumMismatch: one flipped bit anywhere in a checksummed event
// is ErrChecksum, never a skip or a wrong value.
func TestChecksumMismatch(t *testing.T) {
	evs := readFixture(t)
	for i := range evs {
		d := NewDecoder(1)
		for j, raw := range evs {
			if j < i {
				if _, err := d.Decode(raw); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if j > i {
				break
			}
			bad := append([]byte(nil), raw...)
			// Flip a bit past the header's size field, so the length check
			// passes and only the checksum can tell.
			k := headerLen + (len(bad)-headerLen)/2
			bad[k] ^= 0x10
			if _, err := d.Decode(bad); !errors.Is(err, ErrChecksum) {
				t.Errorf("event %d (type %d) with byte %d flipped: %v, want ErrChecksum", i, raw[4], k, err)
			}
		}
	}
}

// FuzzDecode feeds arbitrary bytes to a decoder primed with the captured
// stream (format description, table maps) and to a fresh one: errors are
// fine, panics are not.
func FuzzDecode(f *testing.F) {
	evs := readFixture(f)
	for _, raw := range evs {
		f.Add(raw)
		f.Add(unchecked(raw))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, checksum := range []uint8{0, 1} {
			d := NewDecoder(checksum)
			_, _ = d.Decode(data)
			d = NewDecoder(1)
			for _, raw := range evs {
				if _, err := d.Decode(raw); err != nil {
					t.Fatal(err)
				}
			}
			d.checksum = checksum
			_, _ = d.Decode(data)
		}
	})
}

// unchecked is raw without its checksum, its size fixed: the fuzzer then
// reaches the body decoders of a checksum-less decoder.
func unchecked(raw []byte) []byte {
	if len(raw) < headerLen+4 {
		return raw
	}
	out := append([]byte(nil), raw[:len(raw)-4]...)
	binary.LittleEndian.PutUint32(out[9:], uint32(len(out)))
	return out
}
