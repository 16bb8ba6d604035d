package mysqlbinlog

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

// The MySQL-only parts (ROWS_EVENT_V2, the MySQL GTID event,
// COM_BINLOG_DUMP_GTID, binary JSON) have no server here: these tests
// decode byte fixtures built by hand from the layouts in MySQL's
// replication protocol documentation.

// event builds an event: the 19-byte header, body, and a CRC32 when crc.
func event(typ EventType, logPos uint32, body []byte, crc bool) []byte {
	size := headerLen + len(body)
	if crc {
		size += 4
	}
	b := binary.LittleEndian.AppendUint32(nil, 1700000000)
	b = append(b, byte(typ))
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = binary.LittleEndian.AppendUint32(b, uint32(size))
	b = binary.LittleEndian.AppendUint32(b, logPos)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = append(b, body...)
	if crc {
		b = binary.LittleEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
	}
	return b
}

// mysql8FDE is a MySQL 8.0 format description: binlog version 4, the
// server version padded to 50 bytes, a timestamp, header length 19, the
// post-header lengths of types 1–41 (as MySQL 8.0 sends them), the
// checksum algorithm (CRC32).
func mysql8FDE() []byte {
	body := binary.LittleEndian.AppendUint16(nil, 4)
	v := make([]byte, 50)
	copy(v, "8.0.36")
	body = append(body, v...)
	body = binary.LittleEndian.AppendUint32(body, 0)
	body = append(body, headerLen)
	post := make([]byte, 41)
	post[QueryEventType-1] = 13
	post[RotateEventType-1] = 8
	post[FormatDescriptionEventType-1] = 98
	post[TableMapEventType-1] = 8
	for _, t := range []EventType{WriteRowsV1EventType, UpdateRowsV1EventType, DeleteRowsV1EventType} {
		post[t-1] = 8
	}
	for _, t := range []EventType{WriteRowsV2EventType, UpdateRowsV2EventType, DeleteRowsV2EventType} {
		post[t-1] = 10
	}
	post[MySQLGTIDEventType-1] = 42
	body = append(body, post...)
	body = append(body, 1) // CRC32
	return event(FormatDescriptionEventType, 0, body, true)
}

// jsonDoc is {"a":1,"b":[true,"x"]} in MySQL's binary JSON: a small
// object (count 2, size 32), two key entries (offset, length), two value
// entries (int16 1 inline; a small array at offset 20), the keys, and the
// array (count 2, size 12: literal true inline, a string at offset 10).
var jsonDoc = []byte{
	0x00,
	0x02, 0x00, 0x20, 0x00,
	0x12, 0x00, 0x01, 0x00, 0x13, 0x00, 0x01, 0x00,
	0x05, 0x01, 0x00, 0x02, 0x14, 0x00,
	'a', 'b',
	0x02, 0x00, 0x0c, 0x00,
	0x04, 0x01, 0x00, 0x0c, 0x0a, 0x00,
	0x01, 'x',
}

func TestMySQLRowsV2(t *testing.T) {
	d := NewDecoder(1)
	if _, err := d.Decode(mysql8FDE()); err != nil {
		t.Fatal(err)
	}
	// TABLE_MAP: table id (6), flags, schema, table, 3 columns BIGINT,
	// VARCHAR(200) (metadata 200), JSON (4-byte length), null bitmap.
	tm := []byte{0x42, 0, 0, 0, 0, 0, 1, 0, 2, 'd', 'b', 0, 1, 't', 0, 3,
		byte(TypeLongLong), byte(TypeVarchar), byte(TypeJSON), 3, 200, 0, 4, 0b110}
	if _, err := d.Decode(event(TableMapEventType, 200, tm, true)); err != nil {
		t.Fatal(err)
	}
	// WRITE_ROWS v2: table id, flags (end of statement), extra data of
	// 2+3 bytes, 3 columns, all present; one row: null bitmap, 7, "hi",
	// the JSON document.
	row := []byte{0x00}
	row = binary.LittleEndian.AppendUint64(row, 7)
	row = append(row, 2, 'h', 'i')
	row = binary.LittleEndian.AppendUint32(row, uint32(len(jsonDoc)))
	row = append(row, jsonDoc...)
	w := []byte{0x42, 0, 0, 0, 0, 0, 1, 0, 5, 0, 0xaa, 0xbb, 0xcc, 3, 0b111}
	ev, err := d.Decode(event(WriteRowsV2EventType, 300, append(w, row...), true))
	if err != nil {
		t.Fatal(err)
	}
	re := ev.Body.(*RowsEvent)
	if !re.Insert() || !re.EndOfStatement || len(re.Rows) != 1 {
		t.Fatalf("rows event: %+v", re)
	}
	got := re.Rows[0]
	if got[0] != int64(7) || string(got[1].([]byte)) != "hi" || string(got[2].([]byte)) != `{"a":1,"b":[true,"x"]}` {
		t.Fatalf("row: %#v %q %q", got[0], got[1], got[2])
	}
	// UPDATE_ROWS v2: before and after images, the second with a NULL.
	u := []byte{0x42, 0, 0, 0, 0, 0, 1, 0, 2, 0, 3, 0b111, 0b111}
	u = append(u, row...)
	u = append(u, 0b100)
	u = binary.LittleEndian.AppendUint64(u, 8)
	u = append(u, 2, 'h', 'o')
	ev, err = d.Decode(event(UpdateRowsV2EventType, 400, u, true))
	if err != nil {
		t.Fatal(err)
	}
	re = ev.Body.(*RowsEvent)
	if !re.Update() || len(re.Rows) != 2 || re.Rows[1][0] != int64(8) || re.Rows[1][2] != nil {
		t.Fatalf("update: %#v", re.Rows)
	}
}

func TestMySQLGTIDEvent(t *testing.T) {
	sid, _ := hex.DecodeString("3e11fa4771ca11e19e33c80aa9429562")
	body := append([]byte{0x01}, sid...)
	body = binary.LittleEndian.AppendUint64(body, 23)
	body = append(body, 2)
	body = binary.LittleEndian.AppendUint64(body, 21)
	body = binary.LittleEndian.AppendUint64(body, 22)
	body = append(body, make([]byte, 16)...) // later MySQL fields, ignored
	d := NewDecoder(1)
	if _, err := d.Decode(mysql8FDE()); err != nil {
		t.Fatal(err)
	}
	ev, err := d.Decode(event(MySQLGTIDEventType, 500, body, true))
	if err != nil {
		t.Fatal(err)
	}
	g := ev.Body.(*MySQLGTIDEvent)
	if hex.EncodeToString(g.SID[:]) != hex.EncodeToString(sid) || g.GNO != 23 || g.LastCommitted != 21 || g.SequenceNumber != 22 {
		t.Fatalf("gtid event: %+v", g)
	}
	set := MySQLGTIDSet{}
	set.Add(g.SID, g.GNO)
	if set.String() != "3e11fa47-71ca-11e1-9e33-c80aa9429562:23" {
		t.Fatalf("set: %s", set)
	}
}

func TestDumpGTIDCommand(t *testing.T) {
	set, err := ParseMySQLGTIDSet("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5:7, 3E11FA47-71CA-11E1-9E33-C80AA9429562:6")
	if err != nil {
		t.Fatal(err)
	}
	if set.String() != "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-7" {
		t.Fatalf("merged set: %s", set)
	}
	want := "1e" + "0400" + "39300000" + "00000000" + "0400000000000000" + "30000000" +
		"0100000000000000" + "3e11fa4771ca11e19e33c80aa9429562" + "0100000000000000" +
		"0100000000000000" + "0800000000000000"
	if got := hex.EncodeToString(dumpGTIDCommand(12345, set)); got != want {
		t.Fatalf("COM_BINLOG_DUMP_GTID:\n got %s\nwant %s", got, want)
	}
	back, err := decodeMySQLGTIDSet(set.encode())
	if err != nil || back.String() != set.String() {
		t.Fatalf("decode(encode(set)) = %v, %v", back, err)
	}
	for _, bad := range []string{"nope:1", "3E11FA47-71CA-11E1-9E33-C80AA9429562", "3E11FA47-71CA-11E1-9E33-C80AA9429562:5-2"} {
		if _, err := ParseMySQLGTIDSet(bad); err == nil {
			t.Errorf("ParseMySQLGTIDSet(%q) accepted", bad)
		}
	}
	want = "12" + "04000000" + "0000" + "39300000" + hex.EncodeToString([]byte("mysql-bin.000002"))
	if got := hex.EncodeToString(dumpCommand(12345, Position{"mysql-bin.000002", 4})); got != want {
		t.Fatalf("COM_BINLOG_DUMP:\n got %s\nwant %s", got, want)
	}
}

func TestMariaGTIDPos(t *testing.T) {
	p, err := ParseMariaGTIDPos("1-2-7, 0-1-100")
	if err != nil {
		t.Fatal(err)
	}
	p.Update(MariaGTID{Domain: 0, Server: 3, Sequence: 101})
	if p.String() != "0-3-101,1-2-7" {
		t.Fatalf("position: %s", p)
	}
	for _, bad := range []string{"0-1", "a-b-c", "0-1-2,0-1-3"} {
		if _, err := ParseMariaGTIDPos(bad); err == nil {
			t.Errorf("ParseMariaGTIDPos(%q) accepted", bad)
		}
	}
}

func TestBinaryJSON(t *testing.T) {
	large := []byte{0x03, 2, 0, 0, 0, 0, 0, 0, 0}       // large array: count 2, size
	large = append(large, 0x07, 0xfe, 0xff, 0xff, 0xff) // int32 -2 inline
	large = append(large, 0x0b, 0, 0, 0, 0)             // double at offset
	off := len(large) - 1
	binary.LittleEndian.PutUint32(large[len(large)-4:], uint32(off))
	large = binary.LittleEndian.AppendUint64(large, 0x3ff8000000000000) // 1.5
	binary.LittleEndian.PutUint32(large[5:], uint32(len(large)-1))
	for _, c := range []struct {
		in   []byte
		want string
	}{
		{jsonDoc, `{"a":1,"b":[true,"x"]}`},
		{large, `[-2,1.5]`},
		{[]byte{0x04, 0x00}, `null`},
		{[]byte{0x04, 0x02}, `false`},
		{[]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, `18446744073709551615`},
		{[]byte{0x09, 0, 0, 0, 0, 0, 0, 0, 0x80}, `-9223372036854775808`},
		{append([]byte{0x0c, 0x83, 0x01}, bytes.Repeat([]byte{'"'}, 131)...), `"` + strings.Repeat(`\"`, 131) + `"`},
		{nil, `null`},
	} {
		got, err := decodeJSON(c.in)
		if err != nil || string(got) != c.want {
			t.Errorf("decodeJSON(%x) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range [][]byte{
		{0x0f, 10, 2, 0, 0},              // opaque: reported, not guessed
		{0x00, 5, 0, 2, 0},               // object larger than its bytes
		{0x0c, 0x05, 'a'},                // string shorter than its length
		{0x02, 1, 0, 7, 0, 0x0c, 200, 0}, // value offset past the end
		{0x42},
	} {
		if _, err := decodeJSON(bad); err == nil {
			t.Errorf("decodeJSON(%x) accepted", bad)
		}
	}
}

func TestPacketSplit(t *testing.T) {
	for _, n := range []int{0, 10, maxPayload - 1, maxPayload, maxPayload + 10} {
		var buf bytes.Buffer
		w := packetIO{rw: &buf}
		payload := bytes.Repeat([]byte{0xab}, n)
		if err := w.writePacket(payload); err != nil {
			t.Fatal(err)
		}
		wantPackets := n/maxPayload + 1
		if got := buf.Len() - n; got != 4*wantPackets {
			t.Fatalf("payload of %d: %d header bytes, want %d packets", n, got, wantPackets)
		}
		r := packetIO{rw: &buf}
		back, err := r.readPacket()
		if err != nil || !bytes.Equal(back, payload) || r.seq != uint8(wantPackets) {
			t.Fatalf("payload of %d read back as %d bytes, seq %d, %v", n, len(back), r.seq, err)
		}
	}
	var buf bytes.Buffer
	buf.Write([]byte{1, 0, 0, 5, 0})
	r := packetIO{rw: &buf}
	if _, err := r.readPacket(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("out-of-sequence packet: %v, want ErrMalformed", err)
	}
}

func TestScramble(t *testing.T) {
	scr := make([]byte, 20)
	for i := range scr {
		scr[i] = byte(i + 1)
	}
	// Expected values computed independently from the documented formulas.
	for plugin, want := range map[string]string{
		"mysql_native_password": "b32bb3a583e1340c0a1108d58b1be49781ad8c2f",
		"caching_sha2_password": "746ebe205d56a0707acb3e796e834e0dd7b1d61743b26bd5202c7a623230c7c9",
	} {
		got, err := scrambleFor(plugin, "secret", scr)
		if err != nil || hex.EncodeToString(got) != want {
			t.Errorf("%s: %x, %v; want %s", plugin, got, err, want)
		}
	}
	if _, err := scrambleFor("sha256_password", "x", scr); err == nil {
		t.Error("an unknown plugin was accepted")
	}
}

func TestCheckSettings(t *testing.T) {
	for _, c := range []struct{ logBin, format, image, want string }{
		{"0", "ROW", "FULL", "log_bin"},
		{"1", "MIXED", "FULL", "binlog_format=ROW"},
		{"1", "STATEMENT", "FULL", "binlog_format=ROW"},
		{"1", "ROW", "MINIMAL", "binlog_row_image=FULL"},
		{"1", "ROW", "NOBLOB", "binlog_row_image=FULL"},
	} {
		err := checkSettings(c.logBin, c.format, c.image)
		if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("checkSettings(%s, %s, %s) = %v, want one line naming %s", c.logBin, c.format, c.image, err, c.want)
		}
	}
	if err := checkSettings("1", "row", "full"); err != nil {
		t.Errorf("ready settings: %v", err)
	}
}

func TestDecodeMalformed(t *testing.T) {
	d := NewDecoder(0)
	for name, raw := range map[string][]byte{
		"short":          {1, 2, 3},
		"size mismatch":  event(XIDEventType, 1, make([]byte, 8), false)[:25],
		"rows sans map":  event(WriteRowsV1EventType, 1, []byte{9, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 5}, false),
		"short xid":      event(XIDEventType, 1, []byte{1, 2}, false),
		"gtid list size": event(MariaGTIDListEventType, 1, []byte{0xff, 0xff, 0xff, 0x0f}, false),
	} {
		if _, err := d.Decode(raw); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSkipTable: the rows of a table SkipTable leaves out are not
// decoded, and their events still pass the checksum.
func TestSkipTable(t *testing.T) {
	evs := readFixture(t)
	d := NewDecoder(1)
	d.SkipTable = func(schema, table string) bool { return table == "fx" }
	skipped := 0
	for _, raw := range evs {
		ev, err := d.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := ev.Body.(*RowsEvent); ok {
			if !r.Skipped || r.Rows != nil {
				t.Fatalf("rows of a skipped table decoded: %+v", r)
			}
			skipped++
		}
	}
	if skipped != 3 {
		t.Fatalf("%d rows events skipped, want 3", skipped)
	}
}
