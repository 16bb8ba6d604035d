// Package inboxprom exposes an inbox's metrics to Prometheus. It registers
// on the prometheus.Registerer the caller passes, never on the global one.
//
//	m, err := inboxprom.New(registry)
//	ib, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Metrics: m})
//
// Metrics, labelled by consumer and outcome (processed, duplicate, stale,
// failed, invalid):
//
//   - inbox_messages_total: messages handled. Duplicates and stale events
//     were skipped (the handler did not run); failed ones will be
//     redelivered; invalid ones were refused.
//   - inbox_handle_seconds: time to handle one message, handler and (for
//     Handle) commit included.
//   - inbox_dead_letters_total (by consumer only): dead letters recorded.
//     Any increase wants an operator (`outbox inbox dlq list`).
package inboxprom
