// Package sub is a second public package, with types fixture re-exports.
package sub

import "context"

// Event is a struct.
type Event struct{ ID string }

// Options is re-exported by an alias.
type Options struct {
	Schema  string
	Retries int
	secret  string
}

// Validate is a method of Options.
func (o *Options) Validate() error { return nil }

// Sink is re-exported by an alias.
type Sink interface {
	Publish(ctx context.Context, e Event) error
}

// Base is embedded.
type Base struct{ Name string }

// Ping is promoted to types that embed Base.
func (Base) Ping() error { return nil }

// Pair is generic.
type Pair[A, B any] struct {
	First  A
	Second B
}
