//go:build someday

package constrained

// Someday is only in builds with the tag someday.
func Someday() {}
