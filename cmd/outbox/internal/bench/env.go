package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/outboxdriver"
)

// SettingNames returns the PostgreSQL settings every run reports: those
// that decide what a commit costs (whether and how it waits for the WAL to
// reach the disk, how much it writes, whether commits are grouped), and
// whether autovacuum clears the dead rows that relayed events leave.
func SettingNames() []string {
	return []string{
		"synchronous_commit", "fsync", "wal_sync_method", "wal_level",
		"full_page_writes", "commit_delay", "shared_buffers", "max_connections", "autovacuum",
	}
}

// Env describes the conditions of a run: the server, its settings, the
// client machine and the method.
type Env struct {
	// ServerVersion is PostgreSQL's server_version.
	ServerVersion string `json:"server_version"`
	// Settings holds the value of every setting in SettingNames().
	Settings map[string]string `json:"settings"`
	// Host is the database host as the client dialled it.
	Host string `json:"host"`
	// CPUs and GOMAXPROCS of the client; GoVersion built it.
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	// LoadAvg is the client machine's /proc/loadavg when the run started
	// (1, 5 and 15 minutes), empty where there is none.
	LoadAvg string `json:"loadavg,omitempty"`
	// Started is when the run started.
	Started time.Time `json:"started"`
	// DurationSeconds, Rounds and WarmupSeconds are the method: each cell
	// was measured for DurationSeconds in all, in Rounds equal slices,
	// each after WarmupSeconds of unmeasured load.
	DurationSeconds float64 `json:"duration_seconds"`
	Rounds          int     `json:"rounds"`
	WarmupSeconds   float64 `json:"warmup_seconds"`
	// SchemaVersion is the outbox schema version the scenario migrated
	// its table to, when it has one.
	SchemaVersion int `json:"schema_version,omitempty"`
	// RelayProcess says the relay ran as a process of its own.
	RelayProcess bool `json:"relay_process,omitempty"`
	// Checkpoint says whether a CHECKPOINT ran before every measurement
	// (it needs superuser or pg_checkpoint; without, drift is larger).
	Checkpoint bool `json:"checkpoint"`
	// Events, Batch and CleanupLimit are the retention scenario's method:
	// the backlog drained for each mode, the relay's claim limit, and the
	// limit of each Cleanup call.
	Events       int `json:"events,omitempty"`
	Batch        int `json:"batch,omitempty"`
	CleanupLimit int `json:"cleanup_limit,omitempty"`
}

// ReadEnv reads the server's version and settings (SettingNames(), then
// extra) and describes the client.
func ReadEnv(ctx context.Context, pool *pgxpool.Pool, extra ...string) (*Env, error) {
	e := &Env{
		Settings:   map[string]string{},
		Host:       pool.Config().ConnConfig.Host,
		CPUs:       runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion:  runtime.Version(),
		Started:    time.Now().UTC().Truncate(time.Second),
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			e.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&e.ServerVersion); err != nil {
		return nil, fmt.Errorf("bench: read server version: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1)`, append(SettingNames(), extra...))
	if err != nil {
		return nil, fmt.Errorf("bench: read settings: %w", err)
	}
	var name, value string
	if _, err := pgx.ForEachRow(rows, []any{&name, &value}, func() error {
		e.Settings[name] = value
		return nil
	}); err != nil {
		return nil, fmt.Errorf("bench: read settings: %w", err)
	}
	return e, nil
}

// SettingsLine renders the settings in SettingNames() order, then any other
// in name order, name=value.
func (e *Env) SettingsLine() string {
	var b strings.Builder
	names := SettingNames()
	for _, n := range slices.Sorted(maps.Keys(e.Settings)) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, n := range names {
		v, ok := e.Settings[n]
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(n + "=" + v)
	}
	return b.String()
}

// freshSchema creates the schema name (a new outbox_bench_<random> when
// empty) and returns it with a function that drops it and everything in
// it. The drop runs even when ctx has ended.
func freshSchema(ctx context.Context, pool *pgxpool.Pool, name string) (string, func() error, error) {
	if name == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		name = "outbox_bench_" + hex.EncodeToString(b)
	}
	if err := outboxdriver.ValidateIdent("schema", name); err != nil {
		return "", nil, fmt.Errorf("bench: %w", err)
	}
	q := outboxdriver.QuoteIdent(name)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+q); err != nil {
		return "", nil, fmt.Errorf("bench: create schema %s (it must not exist): %w", name, err)
	}
	drop := func() error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(dctx, `DROP SCHEMA `+q+` CASCADE`); err != nil {
			return fmt.Errorf("bench: drop schema %s: %w", name, err)
		}
		return nil
	}
	return name, drop, nil
}

// checkpoint runs CHECKPOINT, so that each measurement starts with the WAL
// flushed and no checkpoint due. It reports false, and no error, when the
// role may not.
func checkpoint(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	_, err := pool.Exec(ctx, `CHECKPOINT`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("bench: checkpoint: %w", err)
	}
	return true, nil
}
