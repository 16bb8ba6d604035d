// Package sink defines the seam between the relay and a message broker: a
// Sink publishes a batch of messages and reports a result per message.
//
// A sink reports success for a message only once the broker has durably
// accepted it (a JetStream PubAck, a Kafka acks=all produce response, a
// RabbitMQ publisher confirm). Errors are transient unless marked with
// Permanent; the relay retries transient errors and dead-letters permanent
// ones.
package sink

import (
	"context"
	"errors"
)

// Header is one message header. Headers keep their order; a name may repeat.
type Header struct {
	Key   string
	Value string
}

// Message is one event as a broker sees it, after routing.
type Message struct {
	// ID is the event id. Sinks pass it on as the broker's de-duplication key
	// where one exists (Nats-Msg-Id, Kafka idempotent producer, AMQP
	// message-id) and always as the header "id".
	ID string
	// Destination is the routed topic, subject or stream name.
	Destination string
	// Key is the partitioning key (the aggregate id by default).
	Key []byte
	// Type is the event type, for brokers with a field for it (the AMQP
	// type property, the Redis entry's "type" field). May be empty.
	Type string
	// Value is the payload, published as is. Nil means no payload.
	Value []byte
	// Headers are published with the message, "id" first.
	Headers []Header
}

// Header returns the value of the first header named key and whether it exists.
func (m *Message) Header(key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

// Sink publishes messages to a broker.
type Sink interface {
	// Publish publishes msgs and returns one error per message, in the same
	// order: nil when the broker durably acknowledged it. Messages with the
	// same Key are sent in slice order. Publish returns when every message
	// has a result or ctx is done (the remaining results are then ctx's
	// error). The returned slice always has len(msgs) entries.
	Publish(ctx context.Context, msgs []Message) []error
	// Close releases what the sink created itself; clients passed in by the
	// caller are left open.
	Close() error
}

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the broker will never accept this message
// (too large, invalid subject, rejected by policy). The relay dead-letters a
// message whose publish failed permanently without further attempts.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Results returns a slice of n results that all hold err; a helper for sinks
// that fail a whole batch at once.
func Results(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// unavailableError marks an error that says the broker could not be
// reached, not that this message is at fault.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as a broker outage (connection lost, no answer):
// it says nothing about the message, so the relay retries it without
// spending one of its attempts and backs off as a whole. Unavailable(nil)
// is nil.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err}
}

// IsUnavailable reports whether err, or an error it wraps, was marked
// Unavailable.
func IsUnavailable(err error) bool {
	var u *unavailableError
	return errors.As(err, &u)
}

// Systemer is implemented by sinks that name their broker as
// OpenTelemetry's messaging.system attribute does ("kafka", "nats",
// "rabbitmq", ...); the relay's publish spans carry it.
type Systemer interface {
	System() string
}
