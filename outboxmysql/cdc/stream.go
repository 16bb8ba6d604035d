package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/mysqlbinlog"
	"github.com/outboxkit/outbox/outboxdriver"
)

// savedPos is the position last saved in <table>_binlog.
type savedPos struct {
	pos  mysqlbinlog.Position
	gtid string
}

// after reports whether p is past q in the log (file names sort in log
// order: a base name and a zero-padded number).
func after(p, q mysqlbinlog.Position) bool {
	if p.File != q.File {
		return p.File > q.File
	}
	return p.Offset > q.Offset
}

// stream is one run of the streamer under one lease epoch.
type stream struct {
	src    *Source
	epoch  int64
	cancel context.CancelFunc
	done   chan struct{}
	err    error         // why it ended; read after done
	up     chan struct{} // closed once the stream reads
	room   chan struct{} // signalled when events are done
}

func (st *stream) ended() bool {
	select {
	case <-st.done:
		return true
	default:
		return false
	}
}

func (st *stream) isUp() bool {
	select {
	case <-st.up:
		return true
	default:
		return false
	}
}

func (st *stream) roomy() {
	select {
	case st.room <- struct{}{}:
	default:
	}
}

// current reports whether st is the source's stream. s.mu is held.
func (st *stream) current() bool { return st.src.st == st }

var errStopped = errors.New("stream stopped")

// resetLocked forgets the queued events: the stream they came from is
// gone, and the next one reads them again from the saved position.
func (s *Source) resetLocked() {
	s.queue.txns, s.queue.pending = nil, 0
	s.queue.mark, s.queue.gtid = s.saved.pos, s.saved.gtid
	s.gen++
}

// startStream starts streaming under lease l. s.mu is held.
func (s *Source) startStream(l outboxdriver.Lease) {
	ctx, cancel := context.WithCancel(context.Background())
	st := &stream{src: s, epoch: l.Epoch, cancel: cancel, done: make(chan struct{}), up: make(chan struct{}), room: make(chan struct{}, 1)}
	s.resetLocked()
	s.st = st
	go func() {
		err := st.run(ctx)
		if ctx.Err() != nil {
			err = nil
		} else if err == nil {
			err = errors.New("outboxmysql: the binlog stream ended")
		}
		if err != nil {
			s.base.Log.Debug("outboxmysql: binlog tailing stopped", "name", s.cfg.Name, "err", err)
		}
		st.err = err
		close(st.done)
		s.signal()
	}()
}

// stopStream stops the stream, if any, and waits for it.
func (s *Source) stopStream() {
	s.mu.Lock()
	st := s.st
	s.st = nil
	if st != nil {
		s.resetLocked()
	}
	s.mu.Unlock()
	if st != nil {
		st.cancel()
		<-st.done
	}
}

// columns maps the outbox table's column names to their ordinal (from 0).
type columns map[string]int

// readColumns reads the table's column order: the binary log carries
// values by position only.
func (s *Source) readColumns(ctx context.Context, schema string) (columns, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT column_name, ordinal_position FROM information_schema.columns
WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position`, schema, s.base.Table.Name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols := columns{}
	for rows.Next() {
		var name string
		var pos int
		if err := rows.Scan(&name, &pos); err != nil {
			return nil, err
		}
		cols[strings.ToLower(name)] = pos - 1
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, c := range []string{"id", "aggregatetype", "aggregateid", "type", "payload", "seq", "created_at", "headers", "tracingspancontext", "payload_raw", "attempts"} {
		if _, ok := cols[c]; !ok {
			return nil, fmt.Errorf("table %s.%s has no column %s (run `outbox migrate`)", schema, s.base.Table.Name, c)
		}
	}
	return cols, nil
}

// run sets up and reads the stream until ctx ends or it fails.
func (st *stream) run(ctx context.Context) error {
	s := st.src
	schema := s.base.Table.Schema
	if schema == "" {
		if err := s.db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&schema); err != nil {
			return fmt.Errorf("outboxmysql: binlog: the current database: %w", err)
		}
	}
	cols, err := s.readColumns(ctx, schema)
	if err != nil {
		return fmt.Errorf("outboxmysql: binlog: %w", err)
	}
	var file, gtid, hwmFile sql.NullString
	var pos, hwmPos sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT file, pos, gtid, hwm_file, hwm_pos FROM `+s.bl+` WHERE name = ?`, s.cfg.Name).Scan(&file, &pos, &gtid, &hwmFile, &hwmPos); err != nil {
		return fmt.Errorf("outboxmysql: binlog: read the saved position: %w", migrateHint(err))
	}
	held, err := s.readHeld(ctx)
	if err != nil {
		return fmt.Errorf("outboxmysql: binlog: read held aggregates: %w", err)
	}
	conn, err := mysqlbinlog.Dial(ctx, mysqlbinlog.Config{Addr: s.mc.Addr, User: s.mc.User, Password: s.mc.Passwd,
		TLS: s.mc.TLS, TLSFallback: s.mc.AllowFallbackToPlaintext})
	if err != nil {
		return fmt.Errorf("outboxmysql: binlog: connect to %s: %w", s.mc.Addr, err)
	}
	defer conn.Close()
	if err := conn.CheckServer(ctx); err != nil {
		return fmt.Errorf("outboxmysql: binlog: %w", err)
	}
	start := mysqlbinlog.Position{File: file.String, Offset: uint32(pos.Int64)}
	if file.Valid {
		files, err := conn.BinaryLogs(ctx)
		if err != nil {
			return fmt.Errorf("outboxmysql: binlog: %w", err)
		}
		if !slices.Contains(files, start.File) {
			lost := fmt.Errorf("%w: the saved position %s (GTID %s) is no longer on the server, whose oldest log is %s: binlog retention (binlog_expire_logs_seconds, expire_logs_days) is shorter than the relay's outage",
				mysqlbinlog.ErrPositionLost, start, gtid.String, first(files))
			if s.cfg.Mode == ModeInsertDelete {
				return fmt.Errorf("outboxmysql: binlog: %w; events written in insert-delete mode after it may be lost", lost)
			}
			s.base.Log.Error("outboxmysql: binlog position lost; relaying the rows still in the table, then streaming again", "name", s.cfg.Name, "err", lost)
			file.Valid = false
		}
	}
	s.mu.Lock()
	if !st.current() {
		s.mu.Unlock()
		return errStopped
	}
	s.queue.held = held
	s.replayUntil = mysqlbinlog.Position{File: hwmFile.String, Offset: uint32(hwmPos.Int64)}
	s.mu.Unlock()
	if !file.Valid {
		var drained *txn
		if start, drained, err = st.drain(ctx, cols); err != nil {
			return err
		}
		if err := st.push(ctx, drained); err != nil {
			return err
		}
	}
	dump, err := conn.StartDump(ctx, mysqlbinlog.DumpConfig{ServerID: s.cfg.ServerID, Position: start, Heartbeat: s.cfg.Heartbeat})
	if err != nil {
		return fmt.Errorf("outboxmysql: binlog: %w", err)
	}
	dump.Decoder().SkipTable = func(sc, table string) bool { return sc != schema || table != s.base.Table.Name }
	close(st.up)
	return st.read(ctx, dump, cols, gtid.String)
}

func first(files []string) string {
	if len(files) == 0 {
		return "(none)"
	}
	return files[0]
}

// drain reads the table's unpublished rows in a consistent snapshot and
// returns them as one transaction whose end is the log position of the
// snapshot: the stream starts there. On MariaDB the position is the
// snapshot's own (binlog_snapshot_file/position); on MySQL it is read
// just before the snapshot, and rows committed in between come twice.
func (st *stream) drain(ctx context.Context, cols columns) (mysqlbinlog.Position, *txn, error) {
	s := st.src
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return mysqlbinlog.Position{}, nil, err
	}
	defer conn.Close()
	var pos mysqlbinlog.Position
	master := func() error {
		var f string
		var p int64
		var skip1, skip2, skip3 sql.RawBytes
		rows, err := conn.QueryContext(ctx, `SHOW MASTER STATUS`)
		if err != nil {
			return err
		}
		defer rows.Close()
		if !rows.Next() {
			return errors.New("SHOW MASTER STATUS returned nothing: the binary log is off")
		}
		cs, _ := rows.Columns()
		dest := []any{&f, &p, &skip1, &skip2, &skip3}[:min(5, len(cs))]
		for len(dest) < len(cs) {
			dest = append(dest, new(sql.RawBytes))
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		pos = mysqlbinlog.Position{File: f, Offset: uint32(p)}
		return nil
	}
	if _, err := conn.ExecContext(ctx, `START TRANSACTION WITH CONSISTENT SNAPSHOT`); err != nil {
		return pos, nil, fmt.Errorf("outboxmysql: binlog drain: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`) //nolint:errcheck
	snap := map[string]string{}
	rows, err := conn.QueryContext(ctx, `SHOW STATUS LIKE 'binlog_snapshot_%'`)
	if err == nil {
		for rows.Next() {
			var k, v string
			if rows.Scan(&k, &v) == nil {
				snap[strings.ToLower(k)] = v
			}
		}
		rows.Close()
	}
	if f, p := snap["binlog_snapshot_file"], snap["binlog_snapshot_position"]; f != "" && p != "" {
		var off uint64
		fmt.Sscan(p, &off)
		pos = mysqlbinlog.Position{File: f, Offset: uint32(off)}
	} else if err := master(); err != nil {
		return pos, nil, fmt.Errorf("outboxmysql: binlog drain: %w", err)
	}
	t := &txn{end: pos}
	rs, err := conn.QueryContext(ctx, `SELECT id, seq, aggregatetype, aggregateid, type, payload, payload_raw, headers,
       tracingspancontext, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at), attempts
FROM `+s.n.Table+` WHERE published_at IS NULL ORDER BY seq`)
	if err != nil {
		return pos, nil, fmt.Errorf("outboxmysql: binlog drain: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		e := &event{}
		var tc sql.NullString
		var micros int64
		if err := rs.Scan(&e.rec.ID, &e.rec.Seq, &e.rec.AggregateType, &e.rec.AggregateID, &e.rec.Type,
			&e.payload, &e.raw, &e.headers, &tc, &micros, &e.rec.Attempts); err != nil {
			return pos, nil, fmt.Errorf("outboxmysql: binlog drain: %w", err)
		}
		e.rec.TraceContext = tc.String
		e.rec.CreatedAt = time.UnixMicro(micros).UTC()
		finishRecord(e)
		t.events = append(t.events, e)
	}
	if err := rs.Err(); err != nil {
		return pos, nil, fmt.Errorf("outboxmysql: binlog drain: %w", err)
	}
	if len(t.events) > 0 {
		s.base.Log.Info("outboxmysql: relaying the rows in the table before streaming the binary log", "rows", len(t.events), "from", pos.String())
	}
	return pos, t, nil
}

// finishRecord fills the record's payload and headers from the columns.
func finishRecord(e *event) {
	e.rec.Partition = partitionOf(e.key())
	driverkit.SetPayload(&e.rec, e.payload, e.payload != nil, e.raw)
	e.rec.Headers, e.rec.HeadersErr = driverkit.DecodeHeaders(e.headers)
}

// push queues a committed transaction, waiting for room first; a
// transaction without events of the table only moves the position.
func (st *stream) push(ctx context.Context, t *txn) error {
	s := st.src
	for {
		s.mu.Lock()
		if !st.current() {
			s.mu.Unlock()
			return errStopped
		}
		if len(t.events) == 0 || s.queue.pending < s.cfg.MaxPending {
			break
		}
		s.mu.Unlock()
		select {
		case <-st.room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	q := &s.queue
	if n := len(q.txns); len(t.events) == 0 && n > 0 && len(q.txns[n-1].events) == 0 {
		// One empty transaction stands for a run of them.
		q.txns[n-1].end = t.end
		if t.gtid != "" {
			q.txns[n-1].gtid = t.gtid
		}
	} else {
		q.push(t)
	}
	q.advance()
	s.mu.Unlock()
	if len(t.events) > 0 {
		s.signal()
	}
	return nil
}

// read decodes the stream into the queue until ctx ends or it fails, and
// saves the position every SaveInterval when it moved.
func (st *stream) read(ctx context.Context, dump *mysqlbinlog.Stream, cols columns, gtid string) error {
	s := st.src
	mariaPos, _ := mysqlbinlog.ParseMariaGTIDPos(gtid)
	if mariaPos == nil {
		mariaPos = mysqlbinlog.MariaGTIDPos{}
	}
	var cur *txn
	began := false
	nextSave := time.Now().Add(s.cfg.SaveInterval)
	commit := func() error {
		t := cur
		if t == nil {
			t = &txn{}
		}
		cur, began = nil, false
		t.end = dump.Position()
		t.gtid = mariaPos.String()
		return st.push(ctx, t)
	}
	for {
		if time.Now().After(nextSave) {
			if err := st.saveIdle(ctx); err != nil {
				return err
			}
			nextSave = time.Now().Add(s.cfg.SaveInterval)
		}
		ev, err := dump.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("outboxmysql: binlog stream at %s: %w", dump.Position(), err)
		}
		switch b := ev.Body.(type) {
		case *mysqlbinlog.MariaGTIDEvent:
			cur, began = &txn{}, !b.Standalone
			mariaPos.Update(b.GTID)
		case *mysqlbinlog.MySQLGTIDEvent:
			cur, began = &txn{}, false
		case *mysqlbinlog.QueryEvent:
			switch q := strings.ToUpper(strings.TrimSpace(b.Query)); {
			case q == "BEGIN":
				if cur == nil {
					cur = &txn{}
				}
				began = true
			case q == "COMMIT" || !began:
				// COMMIT, or a statement outside a transaction (DDL).
				if err := commit(); err != nil {
					return err
				}
			}
		case *mysqlbinlog.XIDEvent:
			if err := commit(); err != nil {
				return err
			}
		case *mysqlbinlog.RowsEvent:
			if b.Skipped || !b.Insert() {
				continue
			}
			if len(b.Table.Types) != len(cols) {
				return fmt.Errorf("outboxmysql: binlog: the table's rows have %d columns, its definition %d: restart the relay after a change of the table", len(b.Table.Types), len(cols))
			}
			if cur == nil {
				cur = &txn{}
			}
			for _, row := range b.Rows {
				e, err := rowEvent(row, cols)
				if err != nil {
					return fmt.Errorf("outboxmysql: binlog: %w", err)
				}
				cur.events = append(cur.events, e)
			}
		}
	}
}

// saveIdle saves the position when it moved past the saved one, under
// the lease: the log of other tables' transactions is released for
// retention even while the table is idle.
func (st *stream) saveIdle(ctx context.Context) error {
	s := st.src
	s.mu.Lock()
	mark, gtid, saved := s.queue.mark, s.queue.gtid, s.saved
	s.mu.Unlock()
	if mark.File == "" || !after(mark, saved.pos) {
		return nil
	}
	err := driverkit.InTx(ctx, s.db, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx *sql.Tx) error {
		if err := s.fence(ctx, tx, st.epoch); err != nil {
			return err
		}
		return s.save(ctx, tx, mark, gtid)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	if after(mark, s.saved.pos) {
		s.saved = savedPos{mark, gtid}
	}
	s.mu.Unlock()
	return nil
}

// fence locks the binlog row and fails with ErrLeaseLost unless the
// relay holds the lease at epoch, by the database clock.
func (s *Source) fence(ctx context.Context, tx *sql.Tx, epoch int64) error {
	var ok bool
	err := tx.QueryRowContext(ctx, `SELECT owner = ? AND epoch = ? AND expires_at > UTC_TIMESTAMP(6) FROM `+s.bl+` WHERE name = ? FOR UPDATE`,
		s.base.Cfg.RelayName, epoch, s.cfg.Name).Scan(&ok)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !ok) {
		return driverkit.LeaseLost(s.base.Cfg.RelayName)
	}
	return err
}

// saveHWM writes the high-water mark, when it is past the saved one.
func (s *Source) saveHWM(ctx context.Context, tx *sql.Tx, p mysqlbinlog.Position) error {
	_, err := tx.ExecContext(ctx, `UPDATE `+s.bl+` SET hwm_file = ?, hwm_pos = ?
WHERE name = ? AND (hwm_file IS NULL OR hwm_file < ? OR (hwm_file = ? AND hwm_pos < ?))`,
		p.File, p.Offset, s.cfg.Name, p.File, p.File, p.Offset)
	return err
}

// save writes the position, when it is past the saved one.
func (s *Source) save(ctx context.Context, tx *sql.Tx, p mysqlbinlog.Position, gtid string) error {
	_, err := tx.ExecContext(ctx, `UPDATE `+s.bl+` SET file = ?, pos = ?, gtid = ?, updated_at = UTC_TIMESTAMP(6)
WHERE name = ? AND (file IS NULL OR file < ? OR (file = ? AND pos < ?))`,
		p.File, p.Offset, nullString(gtid), s.cfg.Name, p.File, p.File, p.Offset)
	return err
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// rowEvent turns an inserted row into an event.
func rowEvent(row []any, cols columns) (*event, error) {
	e := &event{}
	str := func(c string) string { b, _ := row[cols[c]].([]byte); return string(b) }
	by := func(c string) []byte {
		i, ok := cols[c]
		if !ok {
			return nil
		}
		b, _ := row[i].([]byte)
		return b
	}
	e.rec.ID = str("id")
	e.rec.AggregateType, e.rec.AggregateID, e.rec.Type = str("aggregatetype"), str("aggregateid"), str("type")
	seq, ok := row[cols["seq"]].(int64)
	if !ok || e.rec.ID == "" {
		return nil, fmt.Errorf("a row without id or seq (%T)", row[cols["seq"]])
	}
	e.rec.Seq = seq
	e.payload, e.raw, e.headers = by("payload"), by("payload_raw"), by("headers")
	e.rec.TraceContext = string(by("tracingspancontext"))
	if t, ok := row[cols["created_at"]].(time.Time); ok {
		e.rec.CreatedAt = t
	}
	if a, ok := row[cols["attempts"]].(int64); ok {
		e.rec.Attempts = int(a)
	}
	if i, ok := cols["deliver_at"]; ok {
		if t, ok := row[i].(time.Time); ok {
			e.due = t
		}
	}
	finishRecord(e)
	return e, nil
}
