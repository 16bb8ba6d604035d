package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/relay"
)

// The rule for numbers and durations on the command line (docs/cli.md): a
// value you pass is used as given. Zero is accepted only where the flag's
// help gives it a meaning of its own (--down 0 drops the tables,
// --keep-for 0 keeps rows forever, --redis-maxlen 0 never trims, --linger
// 0 and --warmup 0 do not wait, --shutdown-grace 0 gives the batch in
// flight no time); nowhere does 0 stand for the default. Out of range is
// refused with the range; leave a flag out to get its default.

// intIn refuses v outside lo..hi.
func intIn(flag string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("--%s %d: use %d to %d (leave the flag out for its default)", flag, v, lo, hi)
	}
	return nil
}

// intAtLeast refuses v below lo.
func intAtLeast(flag string, v, lo int) error {
	if v < lo {
		return fmt.Errorf("--%s %d: use at least %d (leave the flag out for its default)", flag, v, lo)
	}
	return nil
}

// durationIn refuses d outside lo..hi; hi 0 means no upper bound.
func durationIn(flag string, d, lo, hi time.Duration) error {
	switch {
	case d < lo && lo > 0:
		return fmt.Errorf("--%s %s: use at least %s (leave the flag out for its default)", flag, d, lo)
	case d < lo:
		return fmt.Errorf("--%s %s: must not be negative", flag, d)
	case hi > 0 && d > hi:
		return fmt.Errorf("--%s %s: use at most %s", flag, d, hi)
	}
	return nil
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// relayFlag is the flag that sets a relay.Config field.
type relayFlag struct {
	name string
	// bare phrases a value out of range as "use LO to HI" (or "use at
	// least LO"), whichever side it is on; otherwise as intIn,
	// intAtLeast and durationIn do.
	bare bool
}

// relayFlags maps relay.Config field names to the flags that set them.
type relayFlags map[string]relayFlag

// check runs the relay's own check of cfg (relay.Config.Validate; the
// bounds are the relay's) and names the flag of the field it refuses. cfg
// holds the relay's defaults in the fields no flag sets. An error about a
// field without a flag is returned as the relay words it.
func (fs relayFlags) check(cfg relay.Config) error {
	err := cfg.Validate()
	var ce *relay.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	f, ok := fs[ce.Field]
	if !ok {
		return err
	}
	if ce.MinField != "" {
		if lo, ok := fs[ce.MinField]; ok {
			return fmt.Errorf("--%s %v: use at least --%s (%v)", f.name, ce.Value, lo.name, ce.Min)
		}
		return fmt.Errorf("--%s: %w", f.name, err)
	}
	if f.bare {
		if ce.Max == nil {
			return fmt.Errorf("--%s %v: use at least %v", f.name, ce.Value, ce.Min)
		}
		return fmt.Errorf("--%s %v: use %v to %v", f.name, ce.Value, ce.Min, ce.Max)
	}
	var phrased error
	switch v := ce.Value.(type) {
	case int:
		lo, _ := ce.Min.(int)
		if hi, ok := ce.Max.(int); ok {
			phrased = intIn(f.name, v, lo, hi)
		} else {
			phrased = intAtLeast(f.name, v, lo)
		}
	case time.Duration:
		lo, _ := ce.Min.(time.Duration)
		hi, _ := ce.Max.(time.Duration) // nil: no upper bound, as 0 is to durationIn
		phrased = durationIn(f.name, v, lo, hi)
	}
	if phrased != nil {
		return phrased
	}
	return fmt.Errorf("--%s: %w", f.name, err)
}
