package main

import (
	"fmt"
	"time"
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
