package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Schema is the name SQLite gives the database file a connection opened:
// the default schema of an outbox table. Pass it as outbox.Config.Schema.
const Schema = "main"

// BusyTimeoutMS is how long, in milliseconds, a connection opened by Open
// waits for the write lock before it fails with SQLITE_BUSY. SQLite's
// busy handler is not a queue: a waiter sleeps up to 100 ms between tries
// and can lose every race to writers that come back sooner, so a few busy
// writers and a relay on a loaded machine were seen to starve one of them
// past 5 s. Thirty seconds keeps a burst from failing a business
// transaction; a lock held that long is an outage, not contention.
const BusyTimeoutMS = 30000

// DSN returns the data source name Open uses for the database file at
// path, for callers that call sql.Open("sqlite", ...) themselves:
//
//   - _journal_mode=WAL: readers and the one writer do not block each other.
//   - _busy_timeout: a writer waits up to BusyTimeoutMS for the lock.
//   - _foreign_keys=1: the application's foreign keys are enforced.
//   - _synchronous=FULL: a commit is on disk when it returns. With NORMAL, a
//     power loss may undo the last commits in WAL mode; the relay could
//     have published their events already, and the broker would hold
//     events of business changes that no longer exist. An outbox row
//     must be as durable as the change it reports (G1, G2).
//   - _txlock=immediate: BEGIN takes the write lock at once (a read-only
//     transaction, sql.TxOptions{ReadOnly: true}, does not), so a
//     transaction never fails half-way with SQLITE_BUSY while upgrading
//     its read lock to a write lock.
func DSN(path string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + esc + fmt.Sprintf("?_journal_mode=WAL&_busy_timeout=%d&_foreign_keys=1&_synchronous=FULL&_txlock=immediate", BusyTimeoutMS)
}

// Open opens (creating it when missing) the SQLite database file at path
// with the settings DSN lists, checks that it answers and runs in WAL
// mode, and returns the pool. The directory must exist. The pool is the
// caller's to close.
//
// Use one pool per file in a process, with no MaxOpenConns below 4: a
// relay keeps one connection for its wake-ups and needs others to claim
// and record.
func Open(ctx context.Context, path string) (*sql.DB, error) {
	if path == "" || strings.HasPrefix(path, ":memory:") || strings.HasPrefix(path, "file::memory:") {
		return nil, fmt.Errorf("outboxsqlite: open %q: the outbox needs a database file that the application and the relay share", path)
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("outboxsqlite: open %s: directory %s does not exist", path, dir)
		}
		return nil, fmt.Errorf("outboxsqlite: open %s: %v", path, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("outboxsqlite: open %s: %s is not a directory", path, dir)
	}
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: open %s: %w", path, err)
	}
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		db.Close()
		return nil, fmt.Errorf("outboxsqlite: open %s: %s", path, oneLine(err))
	}
	if !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("outboxsqlite: open %s: journal mode is %q, want wal (WAL needs a local file system with shared memory)", path, mode)
	}
	return db, nil
}

// oneLine keeps an error's text on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
