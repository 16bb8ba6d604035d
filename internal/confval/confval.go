// Package confval holds the small checks every Config of the project repeats.
package confval

import (
	"fmt"
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
