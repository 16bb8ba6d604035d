// Package fixture declares one of each kind of exported item that the API
// listing covers.
package fixture

import (
	"context"
	"errors"
	"io"
	"time"

	"example.com/fixture/internal/hidden"
	"example.com/fixture/sub"
)

// Constants, untyped and typed.
const (
	Answer                = 42
	Name                  = "fixture"
	Pi                    = 3.14159265358979323846264338327950288419716939937510582097494459
	Letter                = 'x'
	On                    = true
	Big                   = 1 << 100
	Timeout time.Duration = 2 * time.Second
)

// Level is a named integer type with constants.
type Level int

// The levels.
const (
	Low Level = iota
	High
)

const unexportedConst = 1

// Variables.
var (
	ErrClosed = errors.New("closed")
	Default   = &Config{}
	Hook      func(context.Context, ...string) (int, error)
	Raw       []byte
)

var unexportedVar int

// New is a function.
func New(r io.Reader, cfg *Config) (*Client, error) { return nil, nil }

// Join is variadic.
func Join(sep string, parts ...string) string { return "" }

// Group is generic.
func Group[T any, K comparable](in []T, key func(T) K) map[K][]T { return nil }

// Sum has a constraint with a type set.
func Sum[N Number](ns ...N) N { return 0 }

func unexportedFunc() {}

// Config is a struct.
type Config struct {
	BatchSize int
	Wait      time.Duration
	Labels    map[string][]byte
	Events    chan<- sub.Event
	Done      <-chan struct{}
	Keys      [4]uint8
	Inline    struct{ A int }
	Any       any
	Stringer  interface{ String() string }
	hidden    int
	io.Writer
}

// Client has methods on the value and the pointer, and a promoted one.
type Client struct {
	cfg Config
	sub.Base
}

// Close is on the pointer.
func (c *Client) Close() error { return nil }

// String is on the value.
func (c Client) String() string { return "" }

func (c *Client) unexported() {}

// Source is an interface that embeds another.
type Source interface {
	io.Closer
	Claim(ctx context.Context, n int) ([]string, error)
}

// Sealed has an unexported method.
type Sealed interface {
	Kind() string
	sealed()
}

// Number is a constraint.
type Number interface {
	~int64 | ~int | float64
}

// Empty is an empty interface.
type Empty interface{}

// Set is a generic type.
type Set[K comparable, V any] struct {
	Items map[K]V
}

// Add is a method of a generic type.
func (s *Set[K, V]) Add(k K, v V) {}

// Handler is a function type.
type Handler func(context.Context, []byte) error

// ID is a named string with a method.
type ID string

// Valid is a method of a named string.
func (id ID) Valid() bool { return true }

// Aliases: of a type outside the module, of a struct, an interface and a
// non-struct type in the module's other packages, generic, and of a type
// of this package.
type (
	Duration     = time.Duration
	Options      = sub.Options
	Sink         = sub.Sink
	Mode         = hidden.Mode
	Pair[T any]  = sub.Pair[T, T]
	LocalConfig  = Config
	unexportedAl = Config
)

type unexportedType struct{}

// Exported is a method of an unexported type.
func (unexportedType) Exported() {}
