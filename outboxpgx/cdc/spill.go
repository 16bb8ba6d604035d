package cdc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// A transaction larger than logical_decoding_work_mem is streamed by
// PostgreSQL while it is still in progress (pgoutput protocol version 2,
// streaming on): its changes come in chunks, between Stream Start and
// Stream Stop, interleaved with other transactions, and its outcome comes
// later as Stream Commit or Stream Abort (of the whole transaction, or of
// one of its subtransactions). Nothing of it may be published before its
// commit, and it may be larger than memory: the decoder writes its events
// to a spill file of its own, in the order they came, each tagged with the
// (sub)transaction that wrote it; a Stream Abort of the transaction
// removes the file, one of a subtransaction forgets that subtransaction's
// events; a Stream Commit reads the file back and hands the events to the
// queue in parts, in order, waiting for room (docs/cdc.md, Large
// transactions).
//
// The events are spilled as decoded, not re-read from the table after the
// commit: messages and insert+delete rows exist only in the WAL, and one
// path serves all three write modes.

// spill is the spill file of one streamed transaction.
type spill struct {
	f       *os.File
	w       *bufio.Writer
	n       int             // events written
	aborted map[uint32]bool // subtransactions rolled back
	// messages counts the logical decoding messages among the events;
	// tainted says one of them may be of a rolled-back subtransaction.
	messages int
	tainted  bool
	buf      []byte
}

// newSpill makes the spill file of a streamed transaction in dir (empty:
// the system's temporary directory).
func newSpill(dir string) (*spill, error) {
	f, err := os.CreateTemp(dir, "outbox-cdc-*.spill")
	if err != nil {
		return nil, fmt.Errorf("make a spill file for a streamed transaction: %w", err)
	}
	return &spill{f: f, w: bufio.NewWriterSize(f, 64<<10), aborted: map[uint32]bool{}}, nil
}

// add writes e, written by (sub)transaction xid.
func (sp *spill) add(xid uint32, e *event) error {
	b := sp.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, xid)
	b = appendSpillString(b, e.ID)
	b = appendSpillString(b, e.AggregateType)
	b = appendSpillString(b, e.AggregateID)
	b = appendSpillString(b, e.Type)
	b = appendSpillBytes(b, e.Payload)
	b = appendSpillBytes(b, e.RawPayload)
	b = appendSpillBytes(b, e.HeadersJSON)
	b = appendSpillString(b, e.TraceContext)
	b = binary.AppendVarint(b, e.Seq)
	var at int64
	if !e.CreatedAt.IsZero() {
		at = e.CreatedAt.UnixNano()
	}
	b = binary.AppendVarint(b, at)
	var due int64 // deliver_at still ahead when read (Source.delay)
	if !e.deliverAt.IsZero() {
		due = e.deliverAt.UnixNano()
	}
	b = binary.AppendVarint(b, due)
	var flags byte
	if e.row {
		flags |= 1
	}
	if e.orphan {
		flags |= 2
	}
	b = append(b, flags)
	bad := ""
	if e.bad != nil {
		bad = e.bad.Error()
	}
	b = appendSpillString(b, bad)
	sp.buf = b
	var n [binary.MaxVarintLen64]byte
	if _, err := sp.w.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))]); err != nil {
		return fmt.Errorf("write the spill file of a streamed transaction: %w", err)
	}
	if _, err := sp.w.Write(b); err != nil {
		return fmt.Errorf("write the spill file of a streamed transaction: %w", err)
	}
	sp.n++
	return nil
}

// replay reads the events back, in the order they were written, without
// those of rolled-back subtransactions, and calls fn with each; a zero
// CreatedAt becomes at (the commit time).
func (sp *spill) replay(at time.Time, fn func(*event) error) error {
	if err := sp.w.Flush(); err != nil {
		return fmt.Errorf("write the spill file of a streamed transaction: %w", err)
	}
	if _, err := sp.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("read the spill file of a streamed transaction: %w", err)
	}
	r := bufio.NewReaderSize(sp.f, 64<<10)
	for i := 0; i < sp.n; i++ {
		size, err := binary.ReadUvarint(r)
		if err != nil {
			return fmt.Errorf("read the spill file of a streamed transaction: %w", err)
		}
		b := make([]byte, size)
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("read the spill file of a streamed transaction: %w", err)
		}
		xid, e, err := decodeSpilled(b)
		if err != nil {
			return fmt.Errorf("read the spill file of a streamed transaction: %w", err)
		}
		if sp.aborted[xid] {
			continue
		}
		if e.CreatedAt.IsZero() {
			e.CreatedAt = at
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// close removes the spill file.
func (sp *spill) close() {
	sp.f.Close()
	os.Remove(sp.f.Name())
}

func appendSpillString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendSpillBytes keeps nil apart from empty: 0 is nil, n+1 is n bytes.
func appendSpillBytes(b, p []byte) []byte {
	if p == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(p))+1)
	return append(b, p...)
}

var errSpillCorrupt = errors.New("corrupt record")

// decodeSpilled decodes one record of a spill file; the event's strings
// and byte slices share b.
func decodeSpilled(b []byte) (uint32, *event, error) {
	if len(b) < 4 {
		return 0, nil, errSpillCorrupt
	}
	xid := binary.LittleEndian.Uint32(b)
	b = b[4:]
	bad := false
	bytesField := func() []byte {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k)+1 {
			bad = true
			return nil
		}
		b = b[k:]
		if n == 0 {
			return nil
		}
		p := b[: n-1 : n-1]
		b = b[n-1:]
		return p
	}
	str := func() string {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			bad = true
			return ""
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s
	}
	varint := func() int64 {
		v, k := binary.Varint(b)
		if k <= 0 {
			bad = true
			return 0
		}
		b = b[k:]
		return v
	}
	e := &event{}
	e.ID, e.AggregateType, e.AggregateID, e.Type = str(), str(), str(), str()
	e.Payload, e.RawPayload, e.HeadersJSON = bytesField(), bytesField(), bytesField()
	e.TraceContext = str()
	e.Seq = varint()
	if at := varint(); at != 0 {
		e.CreatedAt = time.Unix(0, at).UTC()
	}
	if due := varint(); due != 0 {
		e.deliverAt = time.Unix(0, due).UTC()
	}
	if bad || len(b) < 1 {
		return 0, nil, errSpillCorrupt
	}
	flags := b[0]
	b = b[1:]
	e.row, e.orphan = flags&1 != 0, flags&2 != 0
	if why := str(); why != "" {
		e.bad = errors.New(why)
	}
	if bad || len(b) != 0 {
		return 0, nil, errSpillCorrupt
	}
	return xid, e, nil
}
