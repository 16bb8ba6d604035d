package cdc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
)

// Log tailing refuses a table partitioned by time: its rows reach the WAL
// as rows of the partitions, which the publication does not name.
func TestLogTailingRefusesATablePartitionedByTime(t *testing.T) {
	ctx := context.Background()
	pool := testenv.CDCPool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, &outboxdriver.MigrateOptions{TimePartitions: outboxdriver.TimePartitionsDay}); err != nil {
		t.Fatal(err)
	}
	src, err := cdc.NewSource(pool, tb, &cdc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Setup(ctx); err == nil || !strings.Contains(err.Error(), "partitioned by time, and log tailing does not read partitioned tables") {
		t.Fatalf("setting up log tailing of a table partitioned by time: %v", err)
	}
	var slots int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, src.Slot()).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("a slot was made: %d, %v", slots, err)
	}
}
