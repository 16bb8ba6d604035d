//go:build ignore

// gen is run with go run: no build holds it, so it changes no listing.
package main

func main() {}
