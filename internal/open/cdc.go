package open

import (
	"context"
	"fmt"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// CDCSource returns the log-tailing source of table t on db, after
// checking that the database can serve it (wal_level, the REPLICATION
// attribute, the table's migration): a one-line error says what to do
// when it cannot. Log tailing is PostgreSQL's only.
func CDCSource(ctx context.Context, db *DB, t outboxdriver.Table, cfg *outboxpgx.CDCConfig) (outboxdriver.Source, error) {
	if db.Pool == nil {
		return nil, fmt.Errorf("log tailing (--source cdc) needs PostgreSQL; %s relays with --source poll", db.Scheme)
	}
	src, err := outboxpgx.New(db.Pool).NewCDCSource(t, cfg)
	if err != nil {
		return nil, err
	}
	if err := src.Check(ctx); err != nil {
		src.Close()
		return nil, err
	}
	return src, nil
}
