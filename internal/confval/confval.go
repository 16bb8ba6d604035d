// Package confval holds the small checks every Config of the project
// repeats, and the redaction of passwords in URLs for messages.
package confval

import (
	"fmt"
	"net/url"
)

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
