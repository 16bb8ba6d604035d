package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxkit/outbox/outboxsqlite"
)

// openSQLite opens the database file a sqlite:// URL names:
// sqlite://path/to/file.db is relative to the working directory,
// sqlite:///abs/path/file.db absolute.
func openSQLite(ctx context.Context, raw string) (*sqliteStore, error) {
	_, path, _ := strings.Cut(raw, "://")
	if path == "" {
		return nil, fmt.Errorf("--db %s: name the database file, e.g. sqlite://app.db or sqlite:///var/lib/app/app.db", raw)
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("--db %s: a sqlite:// URL takes a file path only, without ? or #", raw)
	}
	db, err := outboxsqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	return &sqliteStore{outboxsqlite.NewStore(db)}, nil
}

// sqliteStore closes the database the command opened.
type sqliteStore struct{ *outboxsqlite.Store }

func (s *sqliteStore) Close() error { return s.DB().Close() }
