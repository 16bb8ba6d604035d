// Package confval holds the small checks and defaults every Config of the
// project repeats, and the redaction of passwords in URLs for messages.
package confval

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
)

// Logger returns l, or, when l is nil, the logger every package of the
// project defaults to: warnings and errors, as text, on standard error.
// Either way its records are one line each (see OneLine).
//
// The default is a new logger each time, never slog.Default(): a component
// logs to the logger its Config gives it, not to whatever the process set
// as its global default. It is not a discarding logger either: what a
// component logs at warning level or above (a dead-lettered event, a lost
// lease, a broken connection) needs someone to act on it.
func Logger(l *slog.Logger) *slog.Logger {
	if l != nil {
		return OneLine(l)
	}
	return OneLine(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// PositiveOr sets *v to def when it is zero and refuses a negative value,
// with an error naming the package and the Config field.
func PositiveOr[T ~int | ~int64](pkg, field string, v *T, def T) error {
	switch {
	case *v < 0:
		return fmt.Errorf("%s: invalid Config.%s %v: must be positive (or 0 for the default %v)", pkg, field, *v, def)
	case *v == 0:
		*v = def
	}
	return nil
}

// RedactURL hides the password of a URL for messages: "(unparsable)" for
// text that does not parse, the text itself when it names no user.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "(unparsable)"
	case u.User == nil:
		return raw
	}
	return u.Redacted()
}
