// Package demo is an example: it has no listing.
package demo

// Run is not listed.
func Run() {}
