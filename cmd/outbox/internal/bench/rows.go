package bench

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Rows other outboxes write, measured beside ours in the write scenario.
const (
	// CaseWatermillRow adds one INSERT of the row Watermill's PostgreSQL
	// outbox writes (watermill-sql's default schema: a bigserial offset,
	// the uuid as varchar(36), created_at, json payload and metadata, the
	// writing transaction's xid8, primary key (transaction_id, offset)):
	// the Go peer's cost of the same event.
	CaseWatermillRow = "watermill_row"
	// CaseOutboxOldRow adds one event through WriteTx into an outbox
	// table of the shape before schema version 10 (a uuid primary key and
	// a (partition, seq) index besides the pending index; WriteModeOldRow).
	CaseOutboxOldRow = "outbox_old_row"
	// WriteModeOldRow adds CaseOutboxOldRow to the write scenario.
	WriteModeOldRow = "old-row"
	// CounterWatermillRows counts the rows found in CaseWatermillRow's
	// table after each round.
	CounterWatermillRows = "watermill_rows"
)

// leanRowVersion is the schema version of the lean outbox row.
const leanRowVersion = 10

// watermillDDL is Watermill's outbox table for PostgreSQL, as its
// default schema adapter creates it.
const watermillDDL = `CREATE TABLE %s (
    "offset"       bigserial,
    uuid           varchar(36) NOT NULL,
    created_at     timestamp   NOT NULL DEFAULT CURRENT_TIMESTAMP,
    payload        json        DEFAULT NULL,
    metadata       json        DEFAULT NULL,
    transaction_id xid8        NOT NULL,
    PRIMARY KEY (transaction_id, "offset"))`

// watermillInsert writes one Watermill row: $1 the uuid, $2 the payload.
const watermillInsert = `INSERT INTO %s (uuid, payload, metadata, transaction_id) VALUES ($1, $2::json, '{}'::json, pg_current_xact_id())`

// execer is a pool, a connection or a transaction.
type execer interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// otherRows holds the tables of CaseWatermillRow and CaseOutboxOldRow.
type otherRows struct {
	watermill string             // qualified Watermill table
	old       outboxdriver.Table // the outbox of the old shape
	obOld     *outbox.Outbox[pgx.Tx]
}

// newOtherRows creates Watermill's table and an outbox table reverted to
// the shape before version 10, in schema.
func newOtherRows(ctx context.Context, db execer, drv *outboxpgx.Driver, schema string) (*otherRows, error) {
	o := &otherRows{watermill: outboxdriver.QuoteIdent(schema) + ".watermill", old: outboxdriver.Table{Schema: schema, Name: "outbox_old"}}
	if _, err := db.Exec(ctx, fmt.Sprintf(watermillDDL, o.watermill)); err != nil {
		return nil, fmt.Errorf("bench: create Watermill's table: %w", err)
	}
	if _, err := drv.Migrate(ctx, o.old, nil); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if _, err := drv.MigrateDown(ctx, o.old, leanRowVersion-1); err != nil {
		return nil, fmt.Errorf("bench: revert %s to the old row: %w", o.old, err)
	}
	var err error
	if o.obOld, err = outbox.New(drv, &outbox.Config{Schema: schema, Table: o.old.Name}); err != nil {
		return nil, err
	}
	return o, nil
}

// writeWatermill inserts one Watermill row with payload in tx.
func (o *otherRows) writeWatermill(ctx context.Context, tx execer, payload []byte) error {
	if _, err := tx.Exec(ctx, fmt.Sprintf(watermillInsert, o.watermill), uuid.Must(uuid.NewV7()).String(), string(payload)); err != nil {
		return fmt.Errorf("insert the Watermill row: %w", err)
	}
	return nil
}
