// Package relayd runs a relay the way the `outbox relay` command does,
// from a database URL and a sink URL, in one call: it opens a connection
// pool sized for the relay's lanes, the driver and its Source, the sink
// (creating the NATS stream or declaring the AMQP exchange when asked),
// the routing, and optionally the Prometheus metrics; Stop closes all of
// it again.
//
//	rl, err := relayd.Open(ctx, "postgres://app@db:5432/app", "nats://nats:4222", nil)
//	if err != nil {
//		return err
//	}
//	if err := rl.Start(ctx); err != nil { // fails fast on a table that is not migrated
//		return err
//	}
//	defer rl.Stop(context.Background())
//
// A Fleet relays several outbox tables (sources) from one process, each
// through a relay as Open makes it, with its publishes shared fairly
// through a Budget; Fleet.Reload changes the set of sources while it runs
// (`outbox relay --config`; docs/operations.md, One relay for many
// databases).
//
// For a pool, a sink client or a Source of your own, use relay.New with a
// driver (outboxpgx.New(pool).NewSource(...)) instead.
package relayd
