// Package constrained has a file that only some builds hold.
package constrained

// Always is in every build.
func Always() {}
