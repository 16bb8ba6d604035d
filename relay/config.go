package relay

import (
	"fmt"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// The bounds of Config's fields, checked by Config.Validate.
const (
	maxBatchSize            = 100_000
	maxLanes                = 64
	maxLinger               = time.Second
	minLeaseTTL             = 300 * time.Millisecond
	minRetryBase            = time.Millisecond
	minPartitionsEvery      = 10 * time.Millisecond
	minPartitionLockTimeout = time.Millisecond
	maxPartitionLockTimeout = time.Minute
	minFinishTimeout        = time.Millisecond
)

// ConfigError reports a Config field whose value is out of its range. New
// and Config.Validate return it; find it with errors.As, also through
// wrapping. Field names the Config field, so that a caller that sets the
// field from a setting of its own can name that setting instead (outbox
// relay names the flag).
type ConfigError struct {
	// Field is the Config field's name, e.g. "BatchSize".
	Field string
	// Value is the value refused, of the field's type: an int, a
	// time.Duration or a Policy.
	Value any
	// Min and Max bound the field's range, both included, and are of
	// Value's type; a nil one leaves that side of the range open.
	Min, Max any
	// MinField, when set, names the field whose value Min is: RetryMax is
	// at least RetryBase.
	MinField string
}

// Error names the field, its value and the range, e.g.
// "relay: Config.Lanes 65: use 1 to 64".
func (e *ConfigError) Error() string {
	if p, ok := e.Value.(Policy); ok {
		return fmt.Sprintf("relay: Config.%s %d: use Hold or Continue", e.Field, int(p))
	}
	var want string
	switch {
	case e.MinField != "":
		want = fmt.Sprintf("use at least %s (%v)", e.MinField, e.Min)
	case e.Min != nil && e.Max != nil:
		want = fmt.Sprintf("use %v to %v", e.Min, e.Max)
	case e.Min == any(time.Duration(0)) || e.Min == any(0):
		want = "must not be negative"
	case e.Min != nil:
		want = fmt.Sprintf("use at least %v", e.Min)
	default:
		want = fmt.Sprintf("use at most %v", e.Max)
	}
	return fmt.Sprintf("relay: Config.%s %v: %s", e.Field, e.Value, want)
}

// WithDefaults returns c with the documented default in every zero field
// that has one: BatchSize, Lanes, PollInterval, LeaseTTL, RetryBase,
// RetryMax, MaxAttempts, CleanupBatch, DropPartitionsAfter,
// PartitionsEvery, PartitionLockTimeout and FinishTimeout. These are the
// values New runs with; it fills Router and Logger itself.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Lanes == 0 {
		c.Lanes = DefaultLanes
	}
	def(&c.PollInterval, 500*time.Millisecond)
	def(&c.LeaseTTL, 10*time.Second)
	def(&c.RetryBase, time.Second)
	def(&c.RetryMax, 5*time.Minute)
	def(&c.FinishTimeout, 10*time.Second)
	def(&c.PartitionsEvery, time.Minute)
	def(&c.PartitionLockTimeout, outboxdriver.DefaultPartitionLockTimeout)
	def(&c.DropPartitionsAfter, c.CleanupAfter)
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 20
	}
	if c.CleanupBatch == 0 {
		c.CleanupBatch = 1000
	}
	return c
}

// Validate returns a *ConfigError for the first field of c, in the order
// Config declares them, that is out of its range:
//
//	BatchSize             1 to 100000
//	Lanes                 1 to 64
//	Linger                0 to 1s
//	PollInterval          at least 1ms
//	LeaseTTL              at least 300ms
//	RetryBase             at least 1ms
//	RetryMax              at least RetryBase
//	MaxAttempts           at least 1
//	Poison                Hold or Continue
//	CleanupAfter          at least 0
//	CleanupBatch          at least 1
//	PartitionsEvery       at least 10ms
//	PartitionLockTimeout  1ms to 1m
//	FinishTimeout         at least 1ms
//
// It checks the values as they stand: a zero that New would replace by
// its default is refused here. To check a Config as New will use it, call
// c.WithDefaults().Validate(), as New does. A caller that must refuse a
// zero it was given (a command-line flag, say) starts from
// Config{}.WithDefaults(), sets the fields it was given and calls
// Validate.
func (c Config) Validate() error {
	for _, err := range []error{
		between("BatchSize", c.BatchSize, 1, maxBatchSize),
		between("Lanes", c.Lanes, 1, maxLanes),
		between("Linger", c.Linger, 0, maxLinger),
		atLeast("PollInterval", c.PollInterval, minWait),
		atLeast("LeaseTTL", c.LeaseTTL, minLeaseTTL),
		atLeast("RetryBase", c.RetryBase, minRetryBase),
		atLeastField("RetryMax", c.RetryMax, "RetryBase", c.RetryBase),
		atLeast("MaxAttempts", c.MaxAttempts, 1),
		between("Poison", c.Poison, Hold, Continue),
		atLeast("CleanupAfter", c.CleanupAfter, 0),
		atLeast("CleanupBatch", c.CleanupBatch, 1),
		atLeast("PartitionsEvery", c.PartitionsEvery, minPartitionsEvery),
		between("PartitionLockTimeout", c.PartitionLockTimeout, minPartitionLockTimeout, maxPartitionLockTimeout),
		atLeast("FinishTimeout", c.FinishTimeout, minFinishTimeout),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// bounded are the types of Config's bounded fields.
type bounded interface {
	~int | ~int64
}

func between[T bounded](field string, v, lo, hi T) error {
	if v < lo || v > hi {
		return &ConfigError{Field: field, Value: v, Min: lo, Max: hi}
	}
	return nil
}

func atLeast[T bounded](field string, v, lo T) error {
	if v < lo {
		return &ConfigError{Field: field, Value: v, Min: lo}
	}
	return nil
}

func atLeastField[T bounded](field string, v T, loField string, lo T) error {
	if v < lo {
		return &ConfigError{Field: field, Value: v, Min: lo, MinField: loField}
	}
	return nil
}
