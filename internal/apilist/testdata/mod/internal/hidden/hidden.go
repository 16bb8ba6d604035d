// Package hidden is internal: it has no listing.
package hidden

// Mode is re-exported by an alias.
type Mode uint8

// String is a method of Mode.
func (m Mode) String() string { return "" }
