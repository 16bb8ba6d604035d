package mysqlbinlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
)

// EventType is a binary log event's type code.
type EventType uint8

// The event types this package knows.
const (
	QueryEventType             EventType = 2
	StopEventType              EventType = 3
	RotateEventType            EventType = 4
	IntvarEventType            EventType = 5
	RandEventType              EventType = 13
	UserVarEventType           EventType = 14
	FormatDescriptionEventType EventType = 15
	XIDEventType               EventType = 16
	TableMapEventType          EventType = 19
	WriteRowsV1EventType       EventType = 23
	UpdateRowsV1EventType      EventType = 24
	DeleteRowsV1EventType      EventType = 25
	HeartbeatEventType         EventType = 27
	RowsQueryEventType         EventType = 29
	WriteRowsV2EventType       EventType = 30
	UpdateRowsV2EventType      EventType = 31
	DeleteRowsV2EventType      EventType = 32
	MySQLGTIDEventType         EventType = 33
	AnonymousGTIDEventType     EventType = 34
	PreviousGTIDsEventType     EventType = 35
	TransactionPayloadType     EventType = 40
	HeartbeatV2EventType       EventType = 41
	AnnotateRowsEventType      EventType = 160
	BinlogCheckpointEventType  EventType = 161
	MariaGTIDEventType         EventType = 162
	MariaGTIDListEventType     EventType = 163
	StartEncryptionEventType   EventType = 164
)

// headerLen is the length of the v4 event header.
const headerLen = 19

// flagArtificial marks an event the server made up for the stream (a
// fake rotate or GTID list), not one read from a log file.
const flagArtificial = 0x20

// Header is the common header of every event.
type Header struct {
	Timestamp uint32
	Type      EventType
	ServerID  uint32
	// Size is the whole event's length, header and checksum included.
	Size uint32
	// LogPos is the position of the next event in the log file (0 in
	// artificial events).
	LogPos uint32
	Flags  uint16
}

// Artificial reports an event made up by the server for the stream.
func (h Header) Artificial() bool { return h.Flags&flagArtificial != 0 }

// Event is one decoded event: its header and one of the *…Event bodies
// below, or nil for a type the package skips.
type Event struct {
	Header Header
	Body   any
}

// FormatDescriptionEvent starts every log file.
type FormatDescriptionEvent struct {
	BinlogVersion uint16
	ServerVersion string
	// Checksum is the checksum algorithm of the file's events (0 none, 1 CRC32).
	Checksum uint8
}

// RotateEvent names the next log file; a fake one (artificial) starts
// the stream.
type RotateEvent struct {
	Position uint64
	File     string
}

// QueryEvent is a statement: BEGIN and COMMIT bound transactions in it,
// DDL comes through it.
type QueryEvent struct {
	Schema string
	Query  string
}

// XIDEvent commits a transaction of a transactional engine.
type XIDEvent struct{ XID uint64 }

// HeartbeatEvent is sent when the log is idle; File is the log file and
// the header's LogPos the position the server has sent up to.
type HeartbeatEvent struct{ File string }

// MariaGTIDEvent starts a MariaDB transaction (it replaces BEGIN).
type MariaGTIDEvent struct {
	GTID MariaGTID
	// Standalone marks an event group without BEGIN/COMMIT (DDL): it
	// ends at its first statement.
	Standalone bool
	Flags      uint8
}

// MariaGTIDListEvent lists the last GTID of every domain before the file.
type MariaGTIDListEvent struct{ GTIDs []MariaGTID }

// MySQLGTIDEvent starts a MySQL transaction.
type MySQLGTIDEvent struct {
	SID            [16]byte
	GNO            int64
	LastCommitted  int64
	SequenceNumber int64
}

// PreviousGTIDsEvent carries the GTID set of all earlier files (MySQL).
type PreviousGTIDsEvent struct{ Set MySQLGTIDSet }

// ErrChecksum reports an event whose CRC32 does not match its bytes.
var ErrChecksum = errors.New("mysqlbinlog: event checksum mismatch")

// Decoder decodes the events of one stream. It keeps what later events
// need: the format description (checksums, post-header lengths) and the
// table maps. Not safe for concurrent use.
type Decoder struct {
	// checksum is the algorithm in effect: the one announced to the
	// server before the dump, then the format description's.
	checksum    uint8
	postHeaders []byte
	tables      map[uint64]*TableMapEvent
	// SkipTable, when set, says which tables' rows events are not
	// decoded (the checksum is still verified): a relay of one table
	// skips the rest of the log cheaply.
	SkipTable func(schema, table string) bool
}

// NewDecoder returns a decoder for a stream whose events carry a checksum
// of algorithm checksum (0 none, 1 CRC32) until a format description says
// otherwise.
func NewDecoder(checksum uint8) *Decoder {
	return &Decoder{checksum: checksum, tables: map[uint64]*TableMapEvent{}}
}

// postHeaderLen is the post-header length of type t, per the format
// description, or def before one arrived.
func (d *Decoder) postHeaderLen(t EventType, def int) int {
	if int(t) >= 1 && int(t) <= len(d.postHeaders) {
		return int(d.postHeaders[t-1])
	}
	return def
}

// Decode decodes one event (the bytes after the stream's OK marker). The
// returned event does not keep data.
func (d *Decoder) Decode(data []byte) (*Event, error) {
	if len(data) < headerLen {
		return nil, fmt.Errorf("%w: event of %d bytes", ErrMalformed, len(data))
	}
	h := Header{
		Timestamp: binary.LittleEndian.Uint32(data[0:]),
		Type:      EventType(data[4]),
		ServerID:  binary.LittleEndian.Uint32(data[5:]),
		Size:      binary.LittleEndian.Uint32(data[9:]),
		LogPos:    binary.LittleEndian.Uint32(data[13:]),
		Flags:     binary.LittleEndian.Uint16(data[17:]),
	}
	if int64(h.Size) != int64(len(data)) {
		return nil, fmt.Errorf("%w: event type %d says %d bytes, has %d", ErrMalformed, h.Type, h.Size, len(data))
	}
	ev := &Event{Header: h}
	if h.Type == FormatDescriptionEventType {
		fde, err := d.formatDescription(data)
		if err != nil {
			return nil, err
		}
		ev.Body = fde
		return ev, nil
	}
	body := data[headerLen:]
	if d.checksum == 1 {
		if len(body) < 4 {
			return nil, fmt.Errorf("%w: event type %d too short for its checksum", ErrMalformed, h.Type)
		}
		n := len(data) - 4
		if crc32.ChecksumIEEE(data[:n]) != binary.LittleEndian.Uint32(data[n:]) {
			return nil, fmt.Errorf("%w: event type %d at log position %d", ErrChecksum, h.Type, h.LogPos)
		}
		body = data[headerLen:n]
	}
	var err error
	switch h.Type {
	case RotateEventType:
		ev.Body, err = d.rotate(body)
	case QueryEventType:
		ev.Body, err = d.query(body)
	case XIDEventType:
		r := reader{b: body}
		ev.Body, err = &XIDEvent{XID: r.uint64("xid")}, r.err
	case HeartbeatEventType:
		ev.Body = &HeartbeatEvent{File: string(body)}
	case TableMapEventType:
		ev.Body, err = d.tableMap(body)
	case WriteRowsV1EventType, UpdateRowsV1EventType, DeleteRowsV1EventType,
		WriteRowsV2EventType, UpdateRowsV2EventType, DeleteRowsV2EventType:
		ev.Body, err = d.rows(h.Type, body)
	case MariaGTIDEventType:
		ev.Body, err = d.mariaGTID(h, body)
	case MariaGTIDListEventType:
		ev.Body, err = mariaGTIDList(body)
	case MySQLGTIDEventType, AnonymousGTIDEventType:
		ev.Body, err = mysqlGTID(body)
	case PreviousGTIDsEventType:
		var set MySQLGTIDSet
		set, err = decodeMySQLGTIDSet(body)
		ev.Body = &PreviousGTIDsEvent{Set: set}
	case TransactionPayloadType:
		err = errors.New("mysqlbinlog: compressed transaction payloads are not supported: set binlog_transaction_compression=OFF")
	case StartEncryptionEventType:
		err = errors.New("mysqlbinlog: encrypted binary logs are not supported")
	default:
		if h.Type >= 166 && h.Type <= 171 {
			err = fmt.Errorf("mysqlbinlog: compressed event type %d is not supported: set log_bin_compress=OFF", h.Type)
		}
		// ANNOTATE_ROWS, BINLOG_CHECKPOINT, INTVAR, … carry nothing the
		// relay needs: Body stays nil.
	}
	if err != nil {
		return nil, err
	}
	return ev, nil
}

// formatDescription decodes a format description and takes its checksum
// algorithm and post-header lengths for the events after it.
func (d *Decoder) formatDescription(data []byte) (*FormatDescriptionEvent, error) {
	r := reader{b: data[headerLen:]}
	fde := &FormatDescriptionEvent{BinlogVersion: r.uint16("binlog version")}
	fde.ServerVersion = strings.TrimRight(string(r.bytes(50, "server version")), "\x00")
	r.uint32("create timestamp")
	if hl := r.uint8("header length"); r.err == nil && hl != headerLen {
		return nil, fmt.Errorf("%w: event header length %d, want %d", ErrMalformed, hl, headerLen)
	}
	if r.err != nil {
		return nil, r.err
	}
	post := r.rest()
	if fde.BinlogVersion != 4 {
		return nil, fmt.Errorf("mysqlbinlog: binlog version %d is not supported (want 4)", fde.BinlogVersion)
	}
	if hasChecksumAlg(fde.ServerVersion) {
		if len(post) < 5 {
			return nil, fmt.Errorf("%w: format description without checksum algorithm", ErrMalformed)
		}
		fde.Checksum = post[len(post)-5]
		if fde.Checksum == 1 {
			n := len(data) - 4
			if crc32.ChecksumIEEE(data[:n]) != binary.LittleEndian.Uint32(data[n:]) {
				return nil, fmt.Errorf("%w: format description", ErrChecksum)
			}
		} else if fde.Checksum != 0 && fde.Checksum != 0xff {
			return nil, fmt.Errorf("mysqlbinlog: checksum algorithm %d is not supported", fde.Checksum)
		}
		if fde.Checksum == 0xff { // undefined: none
			fde.Checksum = 0
		}
		post = post[:len(post)-5]
	}
	d.checksum = fde.Checksum
	d.postHeaders = append([]byte(nil), post...)
	return fde, nil
}

// hasChecksumAlg reports a server version whose format description ends
// with the checksum algorithm: MySQL 5.6.1 and later, MariaDB 5.3 and later.
func hasChecksumAlg(version string) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 3 {
		return false
	}
	major, _ := strconv.Atoi(parts[0])
	minor, _ := strconv.Atoi(parts[1])
	patch, _ := strconv.Atoi(parts[2][:digits(parts[2])])
	if strings.Contains(version, "MariaDB") {
		return major > 5 || (major == 5 && minor >= 3)
	}
	v := major*10000 + minor*100 + patch
	return v >= 50601
}

// digits is the length of the leading digits of s.
func digits(s string) int {
	for i, c := range s {
		if c < '0' || c > '9' {
			return i
		}
	}
	return len(s)
}

func (d *Decoder) rotate(body []byte) (*RotateEvent, error) {
	r := reader{b: body}
	ev := &RotateEvent{}
	if d.postHeaderLen(RotateEventType, 8) >= 8 {
		ev.Position = r.uint64("rotate position")
	}
	ev.File = string(r.rest())
	return ev, r.err
}

func (d *Decoder) query(body []byte) (*QueryEvent, error) {
	r := reader{b: body}
	post := d.postHeaderLen(QueryEventType, 13)
	r.uint32("thread id")
	r.uint32("exec time")
	schemaLen := int(r.uint8("schema length"))
	r.uint16("error code")
	statusLen := 0
	if post >= 13 {
		statusLen = int(r.uint16("status vars length"))
	}
	if post > 13 {
		r.bytes(post-13, "query post-header")
	}
	r.bytes(statusLen, "status vars")
	ev := &QueryEvent{Schema: string(r.bytes(schemaLen, "schema"))}
	r.bytes(1, "schema terminator")
	ev.Query = string(r.rest())
	return ev, r.err
}

func (d *Decoder) mariaGTID(h Header, body []byte) (*MariaGTIDEvent, error) {
	r := reader{b: body}
	ev := &MariaGTIDEvent{}
	ev.GTID.Sequence = r.uint64("gtid sequence")
	ev.GTID.Domain = r.uint32("gtid domain")
	ev.GTID.Server = h.ServerID
	ev.Flags = r.uint8("gtid flags")
	ev.Standalone = ev.Flags&1 != 0
	return ev, r.err
}

func mariaGTIDList(body []byte) (*MariaGTIDListEvent, error) {
	r := reader{b: body}
	n := r.uint32("gtid count") & (1<<28 - 1)
	if r.err == nil && uint64(n)*16 > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: gtid list of %d entries in %d bytes", ErrMalformed, n, len(r.b))
	}
	ev := &MariaGTIDListEvent{GTIDs: make([]MariaGTID, 0, n)}
	for range n {
		var g MariaGTID
		g.Domain = r.uint32("gtid domain")
		g.Server = r.uint32("gtid server")
		g.Sequence = r.uint64("gtid sequence")
		ev.GTIDs = append(ev.GTIDs, g)
	}
	return ev, r.err
}

func mysqlGTID(body []byte) (*MySQLGTIDEvent, error) {
	r := reader{b: body}
	ev := &MySQLGTIDEvent{}
	r.uint8("gtid flags")
	copy(ev.SID[:], r.bytes(16, "gtid sid"))
	ev.GNO = int64(r.uint64("gtid gno"))
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) >= 17 && r.b[0] == 2 { // logical timestamps
		r.uint8("logical timestamp type")
		ev.LastCommitted = int64(r.uint64("last committed"))
		ev.SequenceNumber = int64(r.uint64("sequence number"))
	}
	return ev, r.err
}
