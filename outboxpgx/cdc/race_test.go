//go:build race

package cdc_test

// largeTxEvents is the size of TestCDCMillionEventTransaction's
// transaction. Under the race detector the relay runs several times
// slower, so the suite's race run streams 200,000 events: still five times
// what the memory bound lets the relay hold as decoded events.
const largeTxEvents = 200_000
