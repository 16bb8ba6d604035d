// Package cdc is log tailing for PostgreSQL: the relay's view of an outbox
// table through logical replication (docs/cdc.md). A Source streams the
// table's inserts and its logical decoding messages from a replication
// slot with the pgoutput plugin and hands them to the relay in commit
// order, through the same seam as the polling source of package
// outboxpgx, so routing, sinks, retries, dead letters and metrics are the
// same.
//
// Writers are those of package outboxpgx, in any of its write modes: rows
// (the default), logical decoding messages (outboxpgx.WithMessages) or
// rows deleted again at once (outboxpgx.WithInsertDelete); Mode says which
// a relay expects, for what a lost slot means.
//
//	src, err := cdc.NewSource(pool, outbox.Table{}, &cdc.Config{Mode: cdc.ModeTable})
//	if err != nil { ... }
//	defer src.Close()
//	rl, err := relay.New(src, snk, &relay.Config{...})
//
// The package is experimental (docs/api.md): it may change in a minor
// release.
package cdc
