package cdc

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outbox/outboxdriver"
)

// partSize is the most events of one transaction handed to the queue at
// once (at most MaxPending): a larger transaction goes in parts.
const partSize = 1000

// decoder turns pgoutput messages (protocol version 2, streaming on) into
// transactions of events, handed to emit in commit order.
type decoder struct {
	ctx   context.Context // the stream's
	src   *Source
	rels  map[uint32]*relation
	types *pgtype.Map
	// emit queues a committed transaction, or a part of one (part true:
	// more of it follows).
	emit func(t *txn, part bool) error
	part int // partSize, at most MaxPending

	cur *txn      // the transaction being read (Begin to Commit)
	at  time.Time // the commit time of cur

	// inStream says a chunk of a streamed transaction is being read
	// (Stream Start to Stream Stop); spills holds the spill file of each
	// streamed transaction with events of the table, by its xid.
	inStream bool
	streamed uint32
	spills   map[uint32]*spill
	// seen is the table's columns as last seen, so that a change of them
	// (DDL) is logged.
	seen []string
}

// commitAt is the commit time of the transaction being read; zero in a
// streamed one (the spill file's replay fills it in).
func (d *decoder) commitAt() time.Time {
	if d.inStream {
		return time.Time{}
	}
	return d.at
}

// relation is what the decoder knows of a relation: whether it is the
// outbox table, and where its columns are.
type relation struct {
	ours bool
	col  map[string]int
}

// between reports whether no transaction is half read.
func (d *decoder) between() bool { return d.cur == nil && !d.inStream }

// close removes the spill files.
func (d *decoder) close() {
	for xid, sp := range d.spills {
		sp.close()
		delete(d.spills, xid)
	}
}

// decode handles one pgoutput message.
func (d *decoder) decode(data []byte) error {
	msg, err := pglogrepl.ParseV2(data, d.inStream)
	if err != nil {
		return err
	}
	s := d.src
	switch m := msg.(type) {
	case *pglogrepl.RelationMessageV2:
		d.relation(&m.RelationMessage)
	case *pglogrepl.BeginMessage:
		d.cur, d.at = &txn{xid: m.Xid, lsn: m.FinalLSN, commit: m.CommitTime}, m.CommitTime
	case *pglogrepl.InsertMessageV2:
		r := d.rels[m.RelationID]
		if r == nil || !r.ours {
			return nil
		}
		return d.add(m.Xid, d.row(r, m.Tuple))
	case *pglogrepl.LogicalDecodingMessageV2:
		if !m.Transactional || m.Prefix != s.prefix {
			if m.Prefix == s.prefix && !m.Transactional {
				s.base.Log.Warn("outboxpgx: ignored a non-transactional message with the outbox's prefix: write events with pg_logical_emit_message(true, ...)", "lsn", m.LSN.String())
			}
			return nil
		}
		return d.add(m.Xid, d.message(&m.LogicalDecodingMessage))
	case *pglogrepl.CommitMessage:
		t := d.cur
		d.cur = nil
		if t == nil {
			return nil
		}
		t.end = m.TransactionEndLSN
		return d.emit(t, false)
	case *pglogrepl.StreamStartMessageV2:
		d.inStream, d.streamed = true, m.Xid
		if sp := d.spills[m.Xid]; sp != nil && m.FirstSegment == 1 {
			sp.close() // left from before: the transaction starts anew
			delete(d.spills, m.Xid)
		}
	case *pglogrepl.StreamStopMessageV2:
		d.inStream = false
	case *pglogrepl.StreamAbortMessageV2:
		sp := d.spills[m.Xid]
		switch {
		case sp == nil:
		case m.SubXid == m.Xid || m.SubXid == 0:
			sp.close()
			delete(d.spills, m.Xid)
		default:
			sp.aborted[m.SubXid] = true
			// pgoutput tags a streamed message with the top-level
			// transaction, not with the subtransaction that wrote it: which
			// of them were rolled back cannot be told.
			sp.tainted = sp.tainted || sp.messages > 0
		}
	case *pglogrepl.StreamCommitMessageV2:
		return d.streamCommit(m)
	case *pglogrepl.TruncateMessageV2:
		for _, id := range m.RelationIDs {
			if r := d.rels[id]; r != nil && r.ours {
				s.base.Log.Warn("outboxpgx: ignored a TRUNCATE of the outbox table: truncated rows that were not relayed yet are gone", "table", s.base.Table.String())
				break
			}
		}
	}
	return nil
}

// relation records a relation's columns; a change of the outbox table's
// (DDL) is logged once and otherwise ignored: events are read by column
// name.
func (d *decoder) relation(m *pglogrepl.RelationMessage) {
	s := d.src
	r := &relation{ours: m.Namespace == s.base.Table.Schema && m.RelationName == s.base.Table.Name, col: map[string]int{}}
	names := make([]string, len(m.Columns))
	for i, c := range m.Columns {
		r.col[c.Name] = i
		names[i] = c.Name
	}
	d.rels[m.RelationID] = r
	if !r.ours {
		return
	}
	if d.seen != nil && !slices.Equal(d.seen, names) {
		s.base.Log.Warn("outboxpgx: the outbox table's columns changed (DDL); ignored, events are read by column name",
			"table", s.base.Table.String(), "columns", strings.Join(names, ","))
	}
	d.seen = names
}

// add adds an event written by (sub)transaction xid: to the spill file of
// the streamed transaction being read, or to the transaction being read,
// which goes to the queue in parts once it is large.
func (d *decoder) add(xid uint32, e *event) error {
	if d.inStream {
		sp := d.spills[d.streamed]
		if sp == nil {
			var err error
			if sp, err = newSpill(d.src.cfg.SpillDir); err != nil {
				return err
			}
			d.spills[d.streamed] = sp
		}
		if !e.row {
			sp.messages++
		}
		return sp.add(xid, e)
	}
	if d.cur == nil {
		return nil
	}
	d.cur.events = append(d.cur.events, e)
	if len(d.cur.events) < d.part {
		return nil
	}
	t := d.cur
	d.cur = &txn{xid: t.xid, lsn: t.lsn, commit: t.commit}
	return d.emit(t, true)
}

// streamCommit hands a streamed transaction to the queue, read back from
// its spill file in parts.
func (d *decoder) streamCommit(m *pglogrepl.StreamCommitMessageV2) error {
	sp := d.spills[m.Xid]
	delete(d.spills, m.Xid)
	t := &txn{xid: m.Xid, lsn: m.CommitLSN, commit: m.CommitTime}
	if sp != nil && sp.tainted {
		sp.close()
		return &unstreamError{end: m.TransactionEndLSN}
	}
	if sp != nil {
		defer sp.close()
		err := sp.replay(m.CommitTime, func(e *event) error {
			t.events = append(t.events, e)
			if len(t.events) < d.part {
				return nil
			}
			part := t
			t = &txn{xid: m.Xid, lsn: m.CommitLSN, commit: m.CommitTime}
			return d.emit(part, true)
		})
		if err != nil {
			return err
		}
	}
	t.end = m.TransactionEndLSN
	return d.emit(t, false)
}

// row decodes an INSERT into the outbox table.
func (d *decoder) row(r *relation, tup *pglogrepl.TupleData) *event {
	e := &event{row: true, CreatedAt: d.commitAt()}
	get := func(name string) ([]byte, bool) {
		i, ok := r.col[name]
		if !ok || tup == nil || i >= len(tup.Columns) {
			return nil, false
		}
		c := tup.Columns[i]
		if c.DataType != pglogrepl.TupleDataTypeText {
			return nil, false
		}
		return c.Data, true
	}
	str := func(name string) string { b, _ := get(name); return string(b) }
	e.ID, e.AggregateType, e.AggregateID, e.Type = str("id"), str("aggregatetype"), str("aggregateid"), str("type")
	e.TraceContext = str("tracingspancontext")
	if b, ok := get("seq"); ok {
		e.Seq, _ = strconv.ParseInt(string(b), 10, 64)
	}
	if b, ok := get("created_at"); ok {
		var at time.Time
		if err := d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, b, &at); err == nil {
			e.CreatedAt = at
		}
	}
	if b, ok := get("deliver_at"); ok {
		var at time.Time
		if err := d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, b, &at); err == nil {
			d.src.delay(d.ctx, e, at)
		}
	}
	if b, ok := get("payload"); ok {
		e.Payload = b
	} else if b, ok := get("payload_raw"); ok {
		raw, err := hex.DecodeString(strings.TrimPrefix(string(b), `\x`))
		if err != nil {
			e.bad = fmt.Errorf("payload_raw is not hex bytea text: %v", err)
		}
		e.RawPayload = raw
	}
	if b, ok := get("headers"); ok {
		e.HeadersJSON = b
	}
	return e
}

// message decodes a logical decoding message with the outbox's prefix.
func (d *decoder) message(m *pglogrepl.LogicalDecodingMessage) *event {
	content := bytes.Clone(m.Content)
	ev, err := decodeMessage(content)
	e := &ev
	e.Seq, e.CreatedAt = int64(m.LSN), d.commitAt()
	if err != nil {
		// Dead-lettered with the content as its raw payload.
		e.bad = fmt.Errorf("the message at LSN %s is %w", m.LSN, err)
		e.Payload, e.RawPayload, e.HeadersJSON = nil, content, nil
		if e.ID == "" {
			e.ID = uuid.NewSHA1(uuid.NameSpaceOID, []byte(d.src.prefix+"@"+m.LSN.String())).String()
		}
		e.orphan = outboxdriver.CheckAggregateID(e.AggregateID) != nil || strings.TrimSpace(e.AggregateType) == ""
	}
	return e
}
