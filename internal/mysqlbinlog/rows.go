package mysqlbinlog

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"
)

// ColumnType is a column's type code in a table map.
type ColumnType uint8

// The column types of the binary log.
const (
	TypeDecimal    ColumnType = 0
	TypeTiny       ColumnType = 1
	TypeShort      ColumnType = 2
	TypeLong       ColumnType = 3
	TypeFloat      ColumnType = 4
	TypeDouble     ColumnType = 5
	TypeNull       ColumnType = 6
	TypeTimestamp  ColumnType = 7
	TypeLongLong   ColumnType = 8
	TypeInt24      ColumnType = 9
	TypeDate       ColumnType = 10
	TypeTime       ColumnType = 11
	TypeDateTime   ColumnType = 12
	TypeYear       ColumnType = 13
	TypeVarchar    ColumnType = 15
	TypeBit        ColumnType = 16
	TypeTimestamp2 ColumnType = 17
	TypeDateTime2  ColumnType = 18
	TypeTime2      ColumnType = 19
	TypeJSON       ColumnType = 245
	TypeNewDecimal ColumnType = 246
	TypeEnum       ColumnType = 247
	TypeSet        ColumnType = 248
	TypeTinyBlob   ColumnType = 249
	TypeMediumBlob ColumnType = 250
	TypeLongBlob   ColumnType = 251
	TypeBlob       ColumnType = 252
	TypeVarString  ColumnType = 253
	TypeString     ColumnType = 254
	TypeGeometry   ColumnType = 255
)

// TableMapEvent describes the table of the rows events after it.
type TableMapEvent struct {
	TableID uint64
	Schema  string
	Table   string
	Types   []ColumnType
	// Meta is each column's type metadata (lengths, precision).
	Meta     []uint16
	Nullable []bool
	// Skipped says the decoder's SkipTable left the table out: its rows
	// events are not decoded.
	Skipped bool
}

// RowsEvent carries the rows one statement inserted, updated or deleted.
type RowsEvent struct {
	Type  EventType
	Table *TableMapEvent
	// Rows are the row images: for an update, before and after images
	// alternate (Rows[0] before, Rows[1] after, …). A value is nil (NULL),
	// int64, uint64 (BIT), float32, float64, string (DECIMAL, ENUM/SET
	// numbers as int64), []byte (strings, blobs, JSON text), time.Time
	// (DATETIME, TIMESTAMP: UTC; DATE), time.Duration (TIME).
	Rows [][]any
	// EndOfStatement marks the statement's last rows event.
	EndOfStatement bool
	// Skipped says the table is one SkipTable leaves out: Rows is nil.
	Skipped bool
}

// FixedLength is the byte length of column i when it is CHAR or BINARY
// (0 otherwise). The log strips such values' trailing padding (spaces,
// or zero bytes for BINARY and MariaDB's UUID): a caller that knows the
// column is binary pads the value back to this length.
func (tm *TableMapEvent) FixedLength(i int) int {
	if i < 0 || i >= len(tm.Types) || tm.Types[i] != TypeString {
		return 0
	}
	real, length := ColumnType(tm.Meta[i]>>8), int(tm.Meta[i]&0xff)
	if real != 0 && byte(real)&0x30 != 0x30 {
		length |= int((byte(real)&0x30)^0x30) << 4
		real |= 0x30
	}
	if real == TypeEnum || real == TypeSet {
		return 0
	}
	return length
}

// Insert reports an insert.
func (e *RowsEvent) Insert() bool {
	return e.Type == WriteRowsV1EventType || e.Type == WriteRowsV2EventType
}

// Update reports an update, whose rows alternate before and after images.
func (e *RowsEvent) Update() bool {
	return e.Type == UpdateRowsV1EventType || e.Type == UpdateRowsV2EventType
}

// Delete reports a delete.
func (e *RowsEvent) Delete() bool {
	return e.Type == DeleteRowsV1EventType || e.Type == DeleteRowsV2EventType
}

// Table returns the table map of id seen in this stream, if any.
func (d *Decoder) Table(id uint64) *TableMapEvent { return d.tables[id] }

// tableID reads a table id of the post-header's width.
func (d *Decoder) tableID(r *reader, t EventType, def int) uint64 {
	if d.postHeaderLen(t, def) == 6 {
		return r.uintN(4, "table id")
	}
	return r.uintN(6, "table id")
}

func (d *Decoder) tableMap(body []byte) (*TableMapEvent, error) {
	r := reader{b: body}
	tm := &TableMapEvent{TableID: d.tableID(&r, TableMapEventType, 8)}
	r.uint16("table map flags")
	tm.Schema = string(r.bytes(int(r.uint8("schema length")), "schema"))
	r.uint8("schema terminator")
	tm.Table = string(r.bytes(int(r.uint8("table length")), "table"))
	r.uint8("table terminator")
	n, _ := r.lenenc("column count")
	if r.err != nil {
		return nil, r.err
	}
	if n > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: table map of %d columns in %d bytes", ErrMalformed, n, len(r.b))
	}
	for _, t := range r.bytes(int(n), "column types") {
		tm.Types = append(tm.Types, ColumnType(t))
	}
	metaBlock, _ := r.lenencBytes("column metadata")
	mr := reader{b: metaBlock}
	tm.Meta = make([]uint16, n)
	for i, t := range tm.Types {
		switch t {
		case TypeFloat, TypeDouble, TypeBlob, TypeTinyBlob, TypeMediumBlob, TypeLongBlob,
			TypeGeometry, TypeJSON, TypeTimestamp2, TypeDateTime2, TypeTime2:
			tm.Meta[i] = uint16(mr.uint8("column metadata"))
		case TypeVarchar, TypeVarString, TypeBit:
			tm.Meta[i] = mr.uint16("column metadata")
		case TypeNewDecimal, TypeString, TypeEnum, TypeSet:
			// Two bytes, the first the high one (precision; real type).
			b := mr.bytes(2, "column metadata")
			if b != nil {
				tm.Meta[i] = uint16(b[0])<<8 | uint16(b[1])
			}
		}
	}
	if mr.err != nil {
		return nil, mr.err
	}
	nulls := r.bytes(int((n+7)/8), "null bitmap")
	tm.Nullable = make([]bool, n)
	for i := range tm.Nullable {
		if nulls != nil {
			tm.Nullable[i] = nulls[i/8]&(1<<(i%8)) != 0
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	// Optional metadata (signedness, charsets, names) follows; unused.
	if d.SkipTable != nil {
		tm.Skipped = d.SkipTable(tm.Schema, tm.Table)
	}
	d.tables[tm.TableID] = tm
	return tm, nil
}

// bitmap reads an n-bit bitmap.
func bitmap(r *reader, n int) []bool {
	b := r.bytes((n+7)/8, "bitmap")
	if b == nil {
		return nil
	}
	out := make([]bool, n)
	for i := range out {
		out[i] = b[i/8]&(1<<(i%8)) != 0
	}
	return out
}

func (d *Decoder) rows(t EventType, body []byte) (*RowsEvent, error) {
	v2 := t >= WriteRowsV2EventType
	def := 8
	if v2 {
		def = 10
	}
	r := reader{b: body}
	id := d.tableID(&r, t, def)
	flags := r.uint16("rows flags")
	if v2 {
		extra := int(r.uint16("rows extra data length"))
		if extra < 2 {
			r.fail("rows extra data")
		}
		r.bytes(extra-2, "rows extra data")
	}
	n, _ := r.lenenc("column count")
	if r.err != nil {
		return nil, r.err
	}
	tm := d.tables[id]
	if tm == nil {
		return nil, fmt.Errorf("mysqlbinlog: rows event for table id %d without a table map", id)
	}
	if n != uint64(len(tm.Types)) {
		return nil, fmt.Errorf("%w: rows event of %d columns for table %s.%s of %d", ErrMalformed, n, tm.Schema, tm.Table, len(tm.Types))
	}
	ev := &RowsEvent{Type: t, Table: tm, EndOfStatement: flags&1 != 0, Skipped: tm.Skipped}
	if tm.Skipped {
		return ev, nil
	}
	present := bitmap(&r, int(n))
	presentAfter := present
	update := t == UpdateRowsV1EventType || t == UpdateRowsV2EventType
	if update {
		presentAfter = bitmap(&r, int(n))
	}
	if r.err != nil {
		return nil, r.err
	}
	for len(r.b) > 0 {
		before := len(r.b)
		row, err := decodeRow(&r, tm, present)
		if err != nil {
			return nil, err
		}
		ev.Rows = append(ev.Rows, row)
		if update {
			row, err := decodeRow(&r, tm, presentAfter)
			if err != nil {
				return nil, err
			}
			ev.Rows = append(ev.Rows, row)
		}
		if len(r.b) == before {
			return nil, fmt.Errorf("%w: rows event whose rows have no bytes", ErrMalformed)
		}
	}
	return ev, nil
}

// decodeRow reads one row image; a column not present is nil.
func decodeRow(r *reader, tm *TableMapEvent, present []bool) ([]any, error) {
	count := 0
	for _, p := range present {
		if p {
			count++
		}
	}
	nulls := bitmap(r, count)
	if r.err != nil {
		return nil, r.err
	}
	row := make([]any, len(tm.Types))
	k := 0
	for i, t := range tm.Types {
		if !present[i] {
			continue
		}
		null := nulls[k]
		k++
		if null {
			continue
		}
		v, err := decodeValue(r, t, tm.Meta[i])
		if err != nil {
			return nil, fmt.Errorf("column %d of %s.%s: %w", i+1, tm.Schema, tm.Table, err)
		}
		row[i] = v
	}
	return row, nil
}

// decodeValue reads one value of type t with metadata meta.
func decodeValue(r *reader, t ColumnType, meta uint16) (any, error) {
	var v any
	switch t {
	case TypeTiny:
		v = int64(int8(r.uint8("tinyint")))
	case TypeShort:
		v = int64(int16(r.uint16("smallint")))
	case TypeInt24:
		u := uint32(r.uintN(3, "mediumint"))
		v = int64(int32(u<<8) >> 8)
	case TypeLong:
		v = int64(int32(r.uint32("int")))
	case TypeLongLong:
		v = int64(r.uint64("bigint"))
	case TypeFloat:
		v = math.Float32frombits(r.uint32("float"))
	case TypeDouble:
		v = math.Float64frombits(r.uint64("double"))
	case TypeYear:
		y := int64(r.uint8("year"))
		if y != 0 {
			y += 1900
		}
		v = y
	case TypeNull:
		v = nil
	case TypeDate:
		u := uint32(r.uintN(3, "date"))
		v = time.Date(int(u>>9), time.Month((u>>5)&15), int(u&31), 0, 0, 0, 0, time.UTC)
	case TypeDateTime2:
		v = datetime2(r, int(meta))
	case TypeTimestamp2:
		sec := binary.BigEndian.Uint32(pad(r.bytes(4, "timestamp")))
		frac := fraction(r, int(meta))
		v = time.Unix(int64(sec), frac*1000).UTC()
	case TypeTimestamp:
		v = time.Unix(int64(r.uint32("timestamp")), 0).UTC()
	case TypeDateTime:
		n := r.uint64("datetime")
		d, hms := n/1000000, n%1000000
		v = time.Date(int(d/10000), time.Month(d/100%100), int(d%100), int(hms/10000), int(hms/100%100), int(hms%100), 0, time.UTC)
	case TypeTime2:
		v = time2(r, int(meta))
	case TypeTime:
		n := int64(r.uintN(3, "time"))
		v = time.Duration(n/10000)*time.Hour + time.Duration(n/100%100)*time.Minute + time.Duration(n%100)*time.Second
	case TypeVarchar, TypeVarString:
		v = lengthPrefixed(r, meta > 255)
	case TypeString:
		real, length := ColumnType(meta>>8), int(meta&0xff)
		if real != 0 && byte(real)&0x30 != 0x30 {
			length |= int((byte(real)&0x30)^0x30) << 4
			real |= 0x30
		}
		switch real {
		case TypeEnum, TypeSet:
			v = int64(r.uintN(length, "enum/set"))
		default:
			v = lengthPrefixed(r, length > 255)
		}
	case TypeEnum, TypeSet:
		v = int64(r.uintN(int(meta&0xff), "enum/set"))
	case TypeBlob, TypeTinyBlob, TypeMediumBlob, TypeLongBlob, TypeGeometry:
		n := r.uintN(int(meta), "blob length")
		if n > uint64(len(r.b)) {
			r.fail("blob")
			break
		}
		v = r.bytes(int(n), "blob")
	case TypeJSON:
		n := r.uintN(int(meta), "json length")
		if n > uint64(len(r.b)) {
			r.fail("json")
			break
		}
		text, err := decodeJSON(r.bytes(int(n), "json"))
		if err != nil {
			return nil, err
		}
		v = text
	case TypeBit:
		nbits := int(meta>>8)*8 + int(meta&0xff)
		b := r.bytes((nbits+7)/8, "bit")
		var u uint64
		for _, c := range b {
			u = u<<8 | uint64(c)
		}
		v = u
	case TypeNewDecimal:
		s, err := decimal(r, int(meta>>8), int(meta&0xff))
		if err != nil {
			return nil, err
		}
		v = s
	default:
		return nil, fmt.Errorf("mysqlbinlog: column type %d is not supported", t)
	}
	if r.err != nil {
		return nil, r.err
	}
	return v, nil
}

// pad returns b or, after a short read, 4 zero bytes.
func pad(b []byte) []byte {
	if len(b) < 4 {
		return make([]byte, 4)
	}
	return b
}

// lengthPrefixed reads a string with a 1- or 2-byte length.
func lengthPrefixed(r *reader, wide bool) []byte {
	var n int
	if wide {
		n = int(r.uint16("string length"))
	} else {
		n = int(r.uint8("string length"))
	}
	return r.bytes(n, "string")
}

// bigEndian reads an n-byte big-endian unsigned integer.
func bigEndian(r *reader, n int, what string) uint64 {
	var v uint64
	for _, c := range r.bytes(n, what) {
		v = v<<8 | uint64(c)
	}
	return v
}

// fraction reads the fractional seconds of a temporal value of fsp
// digits, in microseconds.
func fraction(r *reader, fsp int) int64 {
	switch fsp {
	case 1, 2:
		return int64(bigEndian(r, 1, "fraction")) * 10000
	case 3, 4:
		return int64(bigEndian(r, 2, "fraction")) * 100
	case 5, 6:
		return int64(bigEndian(r, 3, "fraction"))
	}
	return 0
}

// datetime2 reads a DATETIME(fsp) in the binary format of MySQL 5.6.4
// and MariaDB 10.1 (mysql56_temporal_format).
func datetime2(r *reader, fsp int) any {
	packed := int64(bigEndian(r, 5, "datetime")) - 0x8000000000
	frac := fraction(r, fsp)
	if packed < 0 {
		packed = -packed // negative datetimes do not occur in practice
	}
	ymd, hms := packed>>17, packed&(1<<17-1)
	ym := ymd >> 5
	return time.Date(int(ym/13), time.Month(ym%13), int(ymd&31),
		int(hms>>12), int(hms>>6&63), int(hms&63), int(frac)*1000, time.UTC)
}

// time2 reads a TIME(fsp) in the 5.6.4 binary format, as a duration.
func time2(r *reader, fsp int) any {
	// packed is (hours:minutes:seconds)<<24 + microseconds, negative for
	// a negative time.
	var packed int64
	switch fsp {
	case 5, 6:
		packed = int64(bigEndian(r, 6, "time")) - 0x800000000000
	default:
		intPart := int64(bigEndian(r, 3, "time")) - 0x800000
		var frac int64
		switch fsp {
		case 1, 2:
			frac = int64(bigEndian(r, 1, "fraction"))
			if intPart < 0 && frac != 0 {
				intPart++
				frac -= 0x100
			}
			frac *= 10000
		case 3, 4:
			frac = int64(bigEndian(r, 2, "fraction"))
			if intPart < 0 && frac != 0 {
				intPart++
				frac -= 0x10000
			}
			frac *= 100
		}
		packed = intPart<<24 + frac
	}
	neg := packed < 0
	if neg {
		packed = -packed
	}
	hms, micro := packed>>24, packed&(1<<24-1)
	d := time.Duration(hms>>12&1023)*time.Hour + time.Duration(hms>>6&63)*time.Minute +
		time.Duration(hms&63)*time.Second + time.Duration(micro)*time.Microsecond
	if neg {
		d = -d
	}
	return d
}

// digitsToBytes is the number of bytes that hold n decimal digits (n < 9).
var digitsToBytes = [10]int{0, 1, 1, 2, 2, 3, 3, 4, 4, 4}

// decimal reads a DECIMAL(precision, scale) in its binary format and
// returns it as a decimal string.
func decimal(r *reader, precision, scale int) (string, error) {
	if precision <= 0 || precision > 65 || scale > precision || scale > 30 {
		return "", fmt.Errorf("%w: decimal(%d,%d)", ErrMalformed, precision, scale)
	}
	intg := precision - scale
	intFull, intRest := intg/9, intg%9
	fracFull, fracRest := scale/9, scale%9
	size := intFull*4 + digitsToBytes[intRest] + fracFull*4 + digitsToBytes[fracRest]
	raw := r.bytes(size, "decimal")
	if raw == nil {
		return "", r.err
	}
	b := append([]byte(nil), raw...)
	neg := b[0]&0x80 == 0
	b[0] ^= 0x80
	if neg {
		for i := range b {
			b[i] = ^b[i]
		}
	}
	br := reader{b: b}
	var sb strings.Builder
	if neg {
		sb.WriteByte('-')
	}
	var intDigits strings.Builder
	if intRest > 0 {
		fmt.Fprintf(&intDigits, "%d", bigEndian(&br, digitsToBytes[intRest], "decimal"))
	}
	for range intFull {
		fmt.Fprintf(&intDigits, "%09d", bigEndian(&br, 4, "decimal"))
	}
	s := strings.TrimLeft(intDigits.String(), "0")
	if s == "" {
		s = "0"
	}
	sb.WriteString(s)
	if scale > 0 {
		sb.WriteByte('.')
		for range fracFull {
			fmt.Fprintf(&sb, "%09d", bigEndian(&br, 4, "decimal"))
		}
		if fracRest > 0 {
			fmt.Fprintf(&sb, "%0*d", fracRest, bigEndian(&br, digitsToBytes[fracRest], "decimal"))
		}
	}
	return sb.String(), nil
}
