package relayd

import (
	"time"

	"github.com/outboxkit/outbox/relay"
)

// bothMetrics reports to the Prometheus metrics Options.Registerer asks
// for and to the caller's own Relay.Config.Metrics: each receives every
// call, so that neither replaces the other.
type bothMetrics struct {
	prom, own relay.Metrics
}

func (b bothMetrics) Claimed(n int) {
	b.prom.Claimed(n)
	b.own.Claimed(n)
}

func (b bothMetrics) Published(dest string, since time.Duration) {
	b.prom.Published(dest, since)
	b.own.Published(dest, since)
}

func (b bothMetrics) PublishFailed(dest string, permanent bool) {
	b.prom.PublishFailed(dest, permanent)
	b.own.PublishFailed(dest, permanent)
}

func (b bothMetrics) Retried(dest string) {
	b.prom.Retried(dest)
	b.own.Retried(dest)
}

func (b bothMetrics) DeadLettered(dest string) {
	b.prom.DeadLettered(dest)
	b.own.DeadLettered(dest)
}

func (b bothMetrics) PartitionsOwned(n int) {
	b.prom.PartitionsOwned(n)
	b.own.PartitionsOwned(n)
}

// DeadLetteredAs passes the class on to each that counts classes.
func (b bothMetrics) DeadLetteredAs(dest string, class relay.DeadLetterClass) {
	for _, m := range []relay.Metrics{b.prom, b.own} {
		if c, ok := m.(relay.DeadLetterClasses); ok {
			c.DeadLetteredAs(dest, class)
		}
	}
}
