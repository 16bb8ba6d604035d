package cdc

import (
	"fmt"
	"regexp"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Mode says which writes a binlog source expects, which decides what it
// does when its saved position is no longer on the server (the binary
// log was purged).
type Mode int

const (
	// ModeTable: events are rows of the outbox table, marked published
	// (or deleted) by the relay. A lost position is reported and the rows
	// still in the table are relayed before the stream starts again from
	// a consistent position: nothing is lost. The default.
	ModeTable Mode = iota
	// ModeInsertDelete: events are rows deleted again in their own
	// transaction (outboxmysql's insert+delete writes): the table stays
	// empty and the events exist only in the binary log. A lost position
	// stops the relay with an error naming it.
	ModeInsertDelete
)

// String returns "table" or "insert-delete".
func (m Mode) String() string {
	if m == ModeInsertDelete {
		return "insert-delete"
	}
	return "table"
}

// ParseMode parses "table" or "insert-delete".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "table":
		return ModeTable, nil
	case "insert-delete", "insert+delete":
		return ModeInsertDelete, nil
	}
	return 0, fmt.Errorf("unknown binlog mode %q: use table or insert-delete", s)
}

// Config configures a Source.
type Config struct {
	outboxdriver.SourceConfig
	// DSN is the go-sql-driver DSN of the server the replication
	// connection opens (its address, user, password and tls; the database is
	// not used). Required. The account needs REPLICATION SLAVE and
	// REPLICATION CLIENT (BINLOG MONITOR on MariaDB 10.5+).
	DSN string
	// Name is the streamer's name: the row of <table>_binlog that holds
	// its lease and position. Defaults to "default". Letters, digits and
	// underscores, at most 64.
	Name string
	// ServerID is the server id the replication connection registers
	// with: unique among the server's replicas (a second replica with the
	// same id ends the first one's stream). Defaults to one derived from
	// the database, the table and Name (in 1<<30 .. 1<<31).
	ServerID uint32
	// Mode says what a lost position means. Defaults to ModeTable.
	Mode Mode
	// MaxPending bounds the events decoded and not yet published that
	// the source keeps in memory: it stops reading the stream while it
	// holds that many (a larger transaction is read whole). Defaults to
	// 10000.
	MaxPending int
	// SaveInterval is the longest time between two saves of the
	// position while the stream moves past transactions without events
	// of the table. Defaults to 5s.
	SaveInterval time.Duration
	// Heartbeat is how often an idle server sends a heartbeat. Defaults
	// to 1s.
	Heartbeat time.Duration
}

const (
	defaultMaxPending   = 10000
	defaultSaveInterval = 5 * time.Second
	defaultHeartbeat    = time.Second
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// resolve fills the defaults of cfg (nil: none) for table t.
func (cfg *Config) resolve(t outboxdriver.Table) (Config, *mysql.Config, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.DSN == "" {
		return c, nil, fmt.Errorf("binlog: Config.DSN is required (the replication connection's server and account)")
	}
	mc, err := mysql.ParseDSN(c.DSN)
	if err != nil {
		return c, nil, fmt.Errorf("binlog: DSN: %w", err)
	}
	if mc.Net != "" && mc.Net != "tcp" {
		return c, nil, fmt.Errorf("binlog: the replication connection needs TCP, not %s", mc.Net)
	}
	if mc.TLS == nil && mc.TLSConfig != "" && mc.TLSConfig != "false" {
		return c, nil, fmt.Errorf("binlog: DSN tls=%s: no TLS configuration of that name is registered (mysql.RegisterTLSConfig)", mc.TLSConfig)
	}
	if c.Name == "" {
		c.Name = "default"
	}
	if !nameRE.MatchString(c.Name) {
		return c, nil, fmt.Errorf("binlog: streamer name %q: use 1 to 64 letters, digits and underscores", c.Name)
	}
	if c.ServerID == 0 {
		// Two streamers with one server id make the server end the older
		// one's dump: the id names the database, the table and Name.
		schema := t.Schema
		if schema == "" {
			schema = mc.DBName
		}
		c.ServerID = serverIDOf(schema + "." + t.Name + "/" + c.Name)
	}
	if c.Mode != ModeTable && c.Mode != ModeInsertDelete {
		return c, nil, fmt.Errorf("binlog: unknown mode %d", c.Mode)
	}
	if c.MaxPending == 0 {
		c.MaxPending = defaultMaxPending
	}
	if c.MaxPending < 1 {
		return c, nil, fmt.Errorf("binlog: MaxPending %d must be positive", c.MaxPending)
	}
	if c.SaveInterval == 0 {
		c.SaveInterval = defaultSaveInterval
	}
	if c.SaveInterval < 10*time.Millisecond || c.SaveInterval > time.Minute {
		return c, nil, fmt.Errorf("binlog: SaveInterval %s: use 10ms to 1m", c.SaveInterval)
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = defaultHeartbeat
	}
	if c.Heartbeat < 10*time.Millisecond || c.Heartbeat > time.Minute {
		return c, nil, fmt.Errorf("binlog: Heartbeat %s: use 10ms to 1m", c.Heartbeat)
	}
	return c, mc, nil
}

// serverIDOf derives a replica server id from s, away from the small ids
// servers are usually given.
func serverIDOf(s string) uint32 {
	var h uint32 = 2166136261
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return 1<<30 | h&(1<<30-1)
}
