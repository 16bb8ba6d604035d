// Package relayd runs a relay the way the `outbox relay` command does,
// from a database URL and a sink, in one call: it opens a connection pool
// sized for the relay's lanes, the driver and its Source, the routing,
// and optionally the Prometheus metrics; Stop closes all of it again, the
// sink included.
//
// The caller opens the sink with its broker's package, so that the
// program links that broker's client only (package sink/sinkurl opens one
// from a URL, and links them all):
//
//	snk, err := natssink.DialStream(ctx, "nats://nats:4222", nil)
//	if err != nil {
//		return err
//	}
//	rl, err := relayd.Open(ctx, "postgres://app@db:5432/app", snk, nil)
//	if err != nil {
//		return err
//	}
//	if err := rl.Start(ctx); err != nil { // fails fast on a table that is not migrated
//		return err
//	}
//	defer rl.Stop(context.Background())
//
// Package relayd/fleet relays several outbox tables from one process.
//
// For a pool, a sink client or a Source of your own, use relay.New with a
// driver (outboxpgx.New(pool).NewSource(...)) instead.
package relayd
