package mysqlbinlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrNotReady reports a server that cannot be tailed: a setting or a
// privilege is missing. The error's text names it.
var ErrNotReady = errors.New("mysqlbinlog: server not ready for log tailing")

// ErrPositionLost reports a start position the server no longer has
// (its log was purged) or never had.
var ErrPositionLost = errors.New("mysqlbinlog: start position not on the server")

// notReady wraps ErrNotReady with what to change.
func notReady(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotReady, fmt.Sprintf(format, args...))
}

// privilegeError turns an access-denied error into one naming the
// missing privilege; other errors pass unchanged.
func privilegeError(err error, privilege string) error {
	var se *ServerError
	if errors.As(err, &se) && (se.Code == erSpecificAccess || se.Code == erAccessDenied ||
		se.Code == erDBAccessDenied || se.Code == erTableAccessDenied) {
		return notReady("the account lacks the %s privilege (GRANT %s ON *.* TO …): %s", privilege, privilege, se.Message)
	}
	return err
}

// CheckServer verifies what log tailing needs: the binary log on, in
// row format, with full row images, and the REPLICATION CLIENT privilege
// (BINLOG MONITOR on MariaDB 10.5+). REPLICATION SLAVE is checked when
// the dump starts. A failure is one line naming the missing setting.
func (c *Conn) CheckServer(ctx context.Context) error {
	rows, err := c.Query(ctx, "SELECT @@global.log_bin, @@global.binlog_format, @@global.binlog_row_image")
	if err != nil {
		return fmt.Errorf("read the binary log settings: %w", err)
	}
	if len(rows) != 1 || len(rows[0]) != 3 {
		return fmt.Errorf("%w: binary log settings", ErrMalformed)
	}
	if err := checkSettings(string(rows[0][0]), string(rows[0][1]), string(rows[0][2])); err != nil {
		return err
	}
	if _, err := c.Query(ctx, "SHOW BINARY LOGS"); err != nil {
		return privilegeError(err, "REPLICATION CLIENT")
	}
	return nil
}

// checkSettings judges the values of log_bin, binlog_format and
// binlog_row_image.
func checkSettings(logBin, format, image string) error {
	format, image = strings.ToUpper(format), strings.ToUpper(image)
	switch {
	case logBin != "1" && !strings.EqualFold(logBin, "ON"):
		return notReady("the binary log is off: set log_bin (for example log_bin=mysql-bin) and server_id in the server's configuration and restart it")
	case format != "ROW":
		return notReady("binlog_format is %s: set binlog_format=ROW", format)
	case image != "FULL":
		return notReady("binlog_row_image is %s: set binlog_row_image=FULL", image)
	}
	return nil
}

// Position is a place in the binary log: a file and the offset of the
// next event in it.
type Position struct {
	File   string
	Offset uint32
}

func (p Position) String() string { return p.File + ":" + strconv.FormatUint(uint64(p.Offset), 10) }

// MasterStatus returns the position the server's log has reached and,
// on MariaDB, its GTID position (@@gtid_binlog_pos).
func (c *Conn) MasterStatus(ctx context.Context) (Position, string, error) {
	rows, err := c.Query(ctx, "SHOW MASTER STATUS")
	var se *ServerError
	if errors.As(err, &se) && se.Code == 1064 { // MySQL 8.4 renamed it
		rows, err = c.Query(ctx, "SHOW BINARY LOG STATUS")
	}
	if err != nil {
		return Position{}, "", privilegeError(err, "REPLICATION CLIENT")
	}
	if len(rows) == 0 || len(rows[0]) < 2 {
		return Position{}, "", notReady("the binary log is off: set log_bin and restart the server")
	}
	off, err := strconv.ParseUint(string(rows[0][1]), 10, 32)
	if err != nil {
		return Position{}, "", fmt.Errorf("%w: master status position %q", ErrMalformed, rows[0][1])
	}
	pos := Position{File: string(rows[0][0]), Offset: uint32(off)}
	var gtid string
	if c.MariaDB {
		if gtid, err = c.QueryValue(ctx, "SELECT @@gtid_binlog_pos"); err != nil {
			return Position{}, "", err
		}
	} else if len(rows[0]) >= 5 {
		gtid = strings.ReplaceAll(string(rows[0][4]), "\n", "")
	}
	return pos, gtid, nil
}

// BinaryLogs lists the log files the server still has, oldest first.
func (c *Conn) BinaryLogs(ctx context.Context) ([]string, error) {
	rows, err := c.Query(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return nil, privilegeError(err, "REPLICATION CLIENT")
	}
	files := make([]string, 0, len(rows))
	for _, r := range rows {
		if len(r) > 0 {
			files = append(files, string(r[0]))
		}
	}
	return files, nil
}

// DumpConfig says where the stream starts and how the replica presents
// itself. Exactly one start: Position (File empty: the server's oldest
// log), MariaGTID, or MySQLGTID.
type DumpConfig struct {
	// ServerID is the replica's server id: unique among the server's
	// replicas and different from the server's own. Required.
	ServerID uint32
	// Position starts at a file and offset (offset 0 means 4, the first
	// event).
	Position Position
	// MariaGTID, when not nil, starts after these MariaDB GTIDs (an empty
	// position starts at the oldest log).
	MariaGTID MariaGTIDPos
	// MySQLGTID, when not nil, starts with the first transaction not in
	// the set (COM_BINLOG_DUMP_GTID; MySQL only).
	MySQLGTID MySQLGTIDSet
	// Heartbeat is how often an idle server sends a heartbeat. Default 0:
	// the server's default (none on MariaDB).
	Heartbeat time.Duration
}

// Stream is a running binary log dump. Not safe for concurrent use.
type Stream struct {
	c   *Conn
	dec *Decoder
	pos Position
}

// StartDump sets the session up (checksum, MariaDB capability, GTID
// start, heartbeat), registers as a replica and asks for the log. The
// connection belongs to the stream from then on.
func (c *Conn) StartDump(ctx context.Context, cfg DumpConfig) (*Stream, error) {
	if cfg.ServerID == 0 {
		return nil, errors.New("mysqlbinlog: DumpConfig.ServerID is required")
	}
	if cfg.MariaGTID != nil && cfg.MySQLGTID != nil {
		return nil, errors.New("mysqlbinlog: DumpConfig has both a MariaDB and a MySQL GTID start")
	}
	if cfg.MariaGTID != nil && !c.MariaDB {
		return nil, errors.New("mysqlbinlog: a MariaDB GTID start needs a MariaDB server")
	}
	if cfg.MySQLGTID != nil && c.MariaDB {
		return nil, errors.New("mysqlbinlog: a MySQL GTID set start needs a MySQL server")
	}
	alg, err := c.QueryValue(ctx, "SELECT @@global.binlog_checksum")
	if err != nil {
		return nil, fmt.Errorf("read binlog_checksum: %w", err)
	}
	var checksum uint8
	switch strings.ToUpper(alg) {
	case "CRC32":
		checksum = 1
	case "NONE", "":
	default:
		return nil, fmt.Errorf("mysqlbinlog: binlog_checksum %s is not supported (use CRC32 or NONE)", alg)
	}
	setup := []string{"SET @master_binlog_checksum = @@global.binlog_checksum"}
	if c.MariaDB {
		setup = append(setup, "SET @mariadb_slave_capability = 4")
	}
	if cfg.Heartbeat > 0 {
		setup = append(setup, "SET @master_heartbeat_period = "+strconv.FormatInt(cfg.Heartbeat.Nanoseconds(), 10))
	}
	if cfg.MariaGTID != nil {
		setup = append(setup,
			"SET @slave_connect_state = "+quote(cfg.MariaGTID.String()),
			"SET @slave_gtid_strict_mode = 0",
			"SET @slave_gtid_ignore_duplicates = 0")
	}
	for _, q := range setup {
		if err := c.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("%s: %w", q, err)
		}
	}
	if err := c.registerReplica(ctx, cfg.ServerID); err != nil {
		return nil, privilegeError(err, "REPLICATION SLAVE")
	}
	s := &Stream{c: c, dec: NewDecoder(checksum), pos: cfg.Position}
	if s.pos.Offset < 4 {
		s.pos.Offset = 4
	}
	var cmd []byte
	switch {
	case cfg.MySQLGTID != nil:
		s.pos = Position{Offset: 4}
		cmd = dumpGTIDCommand(cfg.ServerID, cfg.MySQLGTID)
	default:
		if cfg.MariaGTID != nil {
			s.pos = Position{Offset: 4}
		}
		cmd = dumpCommand(cfg.ServerID, s.pos)
	}
	if err := c.withContext(ctx, func() error { return c.command(cmd) }); err != nil {
		return nil, err
	}
	return s, nil
}

// dumpCommand is COM_BINLOG_DUMP: offset, flags, replica server id,
// file name.
func dumpCommand(serverID uint32, pos Position) []byte {
	cmd := []byte{0x12}
	cmd = binary.LittleEndian.AppendUint32(cmd, pos.Offset)
	cmd = binary.LittleEndian.AppendUint16(cmd, 0)
	cmd = binary.LittleEndian.AppendUint32(cmd, serverID)
	return append(cmd, pos.File...)
}

// dumpGTIDCommand is COM_BINLOG_DUMP_GTID: flags (BINLOG_THROUGH_GTID),
// replica server id, file name length and name (none), offset (4), the
// GTID set's length and binary form.
func dumpGTIDCommand(serverID uint32, set MySQLGTIDSet) []byte {
	enc := set.encode()
	cmd := []byte{0x1e}
	cmd = binary.LittleEndian.AppendUint16(cmd, 0x04)
	cmd = binary.LittleEndian.AppendUint32(cmd, serverID)
	cmd = binary.LittleEndian.AppendUint32(cmd, 0)
	cmd = binary.LittleEndian.AppendUint64(cmd, 4)
	cmd = binary.LittleEndian.AppendUint32(cmd, uint32(len(enc)))
	return append(cmd, enc...)
}

// registerReplica sends COM_REGISTER_SLAVE: server id, host, user,
// password, port, rank, source id.
func (c *Conn) registerReplica(ctx context.Context, serverID uint32) error {
	host, _ := os.Hostname()
	if len(host) > 60 {
		host = host[:60]
	}
	cmd := []byte{0x15}
	cmd = binary.LittleEndian.AppendUint32(cmd, serverID)
	cmd = append(append(cmd, byte(len(host))), host...)
	cmd = append(cmd, 0, 0) // user, password
	cmd = binary.LittleEndian.AppendUint16(cmd, 0)
	cmd = binary.LittleEndian.AppendUint32(cmd, 0)
	cmd = binary.LittleEndian.AppendUint32(cmd, 0)
	return c.withContext(ctx, func() error {
		if err := c.command(cmd); err != nil {
			return err
		}
		p, err := c.pk.readPacket()
		if err != nil {
			return err
		}
		if len(p) > 0 && p[0] == 0xff {
			return parseError(p)
		}
		if len(p) == 0 || p[0] != 0x00 {
			return fmt.Errorf("%w: register replica answer", ErrMalformed)
		}
		return nil
	})
}

// quote quotes s as an SQL string literal.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// Next returns the stream's next event, waiting for one. An error ends
// the stream: the caller closes the connection and starts again from its
// saved position.
func (s *Stream) Next(ctx context.Context) (*Event, error) {
	var p []byte
	err := s.c.withContext(ctx, func() error {
		var err error
		p, err = s.c.pk.readPacket()
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(p) == 0 {
		return nil, fmt.Errorf("%w: empty stream packet", ErrMalformed)
	}
	switch p[0] {
	case 0x00:
	case 0xff:
		err := parseError(p)
		var se *ServerError
		if errors.As(err, &se) {
			switch se.Code {
			case erMasterFatalRead:
				return nil, fmt.Errorf("%w: %s", ErrPositionLost, se.Message)
			case erSpecificAccess, erAccessDenied:
				return nil, privilegeError(err, "REPLICATION SLAVE")
			}
		}
		return nil, err
	case 0xfe:
		if len(p) < 9 {
			return nil, errors.New("mysqlbinlog: the server ended the dump")
		}
		fallthrough
	default:
		return nil, fmt.Errorf("%w: stream packet 0x%02x", ErrMalformed, p[0])
	}
	ev, err := s.dec.Decode(p[1:])
	if err != nil {
		return nil, fmt.Errorf("at %s: %w", s.pos, err)
	}
	switch b := ev.Body.(type) {
	case *RotateEvent:
		s.pos = Position{File: b.File, Offset: uint32(b.Position)}
	case *HeartbeatEvent:
		if b.File != "" && ev.Header.LogPos != 0 {
			s.pos = Position{File: b.File, Offset: ev.Header.LogPos}
		}
	default:
		if ev.Header.LogPos != 0 && !ev.Header.Artificial() {
			s.pos.Offset = ev.Header.LogPos
		}
	}
	return ev, nil
}

// Position is the position after the last event Next returned.
func (s *Stream) Position() Position { return s.pos }

// Decoder is the stream's decoder (its table maps).
func (s *Stream) Decoder() *Decoder { return s.dec }

// Close ends the stream and its connection.
func (s *Stream) Close() error { return s.c.Close() }
