//go:build !race

package main

// raceEnabled reports whether the tests are built with the race detector.
const raceEnabled = false
