//go:build !race

package cdc_test

// largeTxEvents is the size of TestCDCMillionEventTransaction's
// transaction (see race_test.go for the race detector's).
const largeTxEvents = 1_000_000
